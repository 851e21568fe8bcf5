# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""vllm_fleet.fleet.preflight, judged on the controller: the verdict is a pure function of its
arguments (facts already read on the node, the plan, the catalogue), so no module goes to
any node and the catalogue is not copied anywhere. Documented in plugins/modules/preflight.py."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.known_issues import (
    blocked_message,
    judge,
    load_catalogue,
)
from ansible_collections.vllm_fleet.fleet.plugins.modules.preflight import ARGUMENT_SPEC


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]  # (result, validated args)
        try:
            entries = load_catalogue(params["catalogue"])
            report = judge(entries, params["gpu"], params["current"], params["planned"], params["accept"])
        except ValueError as exc:  # CatalogueError and PlanError: the message says what and where
            return {**result, "failed": True, "msg": f"preflight: {exc}"}
        if report["verdict"] == "block":
            report["message"] = blocked_message(report)
            if params["fail_on_blocker"]:
                return {**result, "failed": True, "msg": report["message"], "preflight": report}
        return {**result, "preflight": report}
