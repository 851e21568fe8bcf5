"""Bench tooling: count the module runs Ansible makes on each node (a loop's items one
each), and the controller-side tasks apart, then write them as JSON to the file named by
VLLM_FLEET_MODULE_RUNS at the end of the run.

A module run on a node is one round trip to it: what SSH, pipelining and fewer tasks make
cheaper. Tasks whose action never leaves the controller (set_fact, assert, debug, ...) and
tasks delegated to localhost are counted as controller work, not as node work."""
from __future__ import annotations

import json
import os
from collections import Counter

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: module_runs
type: aggregate
short_description: counts module runs per node (vllm-fleet's benchmarks)
description:
  - Writes the module runs per node, the controller-side tasks per node and the actions per node as JSON
    to the file named by the environment variable VLLM_FLEET_MODULE_RUNS, at the end of the run.
"""

# Actions the controller runs itself (no module is sent to the node): ansible-core's, and this
# collection's action plugins that need no connection (plugins/action).
CONTROLLER_ACTIONS = {
    "set_fact", "assert", "debug", "fail", "meta", "group_by", "add_host", "include_tasks", "import_tasks",
    "include_role", "import_role", "include_vars", "set_stats", "pause", "wait_for_connection",
    "validate_argument_spec", "preflight", "serve_config", "controller_file",
}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_runs"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.node, self.controller = Counter(), Counter()
        self.actions: dict[str, Counter] = {}
        self.tasks: dict[str, Counter] = {}  # per node, the tasks that made them: where to look for savings

    def _count(self, result, item: bool = False):
        task = result._task
        if task.loop and not item:
            return  # the items were counted one by one
        host = result._host.get_name()
        action = task.action.rsplit(".", 1)[-1]
        delegated = result._result.get("_ansible_delegated_vars") or {}
        local = delegated.get("ansible_connection") == "local" or delegated.get("ansible_host") in ("localhost", "127.0.0.1")
        if action in CONTROLLER_ACTIONS or local:
            self.controller[host] += 1
        else:
            self.node[host] += 1
            self.actions.setdefault(host, Counter())[action] += 1
            self.tasks.setdefault(host, Counter())[task.get_name()] += 1

    def v2_runner_on_ok(self, result):
        self._count(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result)

    def v2_runner_on_unreachable(self, result):
        self._count(result)

    def v2_runner_retry(self, result):
        self._count(result, item=True)  # each retry (an async_status poll, an until loop) is a run

    def v2_runner_item_on_ok(self, result):
        self._count(result, item=True)

    def v2_runner_item_on_failed(self, result):
        self._count(result, item=True)

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("VLLM_FLEET_MODULE_RUNS")
        if path:
            with open(path, "w", encoding="utf-8") as out:
                json.dump({"node": self.node, "controller": self.controller,
                           "actions": {h: dict(c) for h, c in self.actions.items()},
                           "tasks": {h: dict(c) for h, c in self.tasks.items()}}, out, indent=1)
