# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""vllm_fleet.fleet.rollout_lock: on a lock host reached through the local connection with no
become (the controller itself, the default next to HAProxy), the lease is taken or released in
the controller's own process, as the module would as the same user: no interpreter and no
module package start for it, twice in every run. Any other lock host runs the module there.
Documented in plugins/modules/rollout_lock.py."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.rollout_lock import lock_task
from ansible_collections.vllm_fleet.fleet.plugins.modules.rollout_lock import ARGUMENT_SPEC


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if self._connection.transport != "local" or self._connection.become is not None:
            return {**result, **self._execute_module(task_vars=task_vars)}
        params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]  # (result, validated args)
        return {**result, **lock_task(params, check=bool(self._task.check_mode))}
