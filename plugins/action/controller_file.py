# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""vllm_fleet.fleet.controller_file, in the controller's own process: a report is written with
no module started anywhere. Documented in plugins/modules/controller_file.py."""
from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.controller_file import (
    ControllerFileError,
    merged,
    write,
)
from ansible_collections.vllm_fleet.fleet.plugins.modules.controller_file import ARGUMENT_SPEC


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]  # (result, validated args)
        path = params["path"]
        try:
            mode = int(params["mode"], 8)
        except ValueError:
            return {**result, "failed": True, "path": path,
                    "msg": f"controller_file: mode {params['mode']!r} is not octal text such as '0644'"}
        try:
            # The text the to_nice_json filter writes, so a report reads the same as before.
            text = to_nice_json(merged(path, params["data"], params["append"]), indent=params["indent"]) + "\n"
            changed = write(path, text, mode, check=bool(self._task.check_mode))
        except (ControllerFileError, TypeError) as exc:
            return {**result, "failed": True, "path": path, "msg": f"controller_file: {exc}"}
        return {**result, "changed": changed, "path": path}
