# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""vllm_fleet.fleet.serve_config, rendered on the controller: the config and environment are a
pure function of the schema, the profile and the role's values, so no module goes to any
node. Documented in plugins/modules/serve_config.py."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import ProfileError, SchemaError, build
from ansible_collections.vllm_fleet.fleet.plugins.modules.serve_config import ARGUMENT_SPEC


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]  # (result, validated args)
        try:
            built = build(params["schema"], params["profile"], role_args=params["role_args"],
                          role_env=params["role_env"], reserved_env=params["reserved_env"], header=params["header"],
                          models_dir=params["models_dir"])
        except SchemaError as exc:
            return {**result, "failed": True, "msg": f"serve_config: {exc}"}
        except ProfileError as exc:
            name = params["profile"].get("name")
            return {**result, "failed": True, "errors": exc.errors,
                    "msg": f"serve_config: profile {name!r} cannot be served ({len(exc.errors)} problem(s)):\n"
                           + "\n".join(f"  - {line}" for line in exc.errors)}
        result["warnings"] = result.get("warnings", []) + built.pop("warnings")
        return {**result, **built}
