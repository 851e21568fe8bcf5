# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""vllm_fleet.fleet.warm_linear: Ansible's linear strategy, with the Jinja plugins loaded once in
the controller before it forks its workers."""
from __future__ import annotations

DOCUMENTATION = r"""
name: warm_linear
short_description: The linear strategy, with the Jinja plugins loaded before the workers fork
description:
  - Runs a play exactly as C(ansible.builtin.linear) does (task by task, every host, in lockstep).
  - Before the play's first task, the controller loads every built-in filter and test and this
    collection's filters. Ansible forks a worker per host per task, and each worker that templates
    a filter or a test otherwise loads them itself (about 10 ms of CPU for the built-in ones, 10 ms
    for this collection's, which the collection loader compiles from source), and discards them
    when it exits. Forked after the load, every worker inherits it.
  - C(ansible.cfg) selects it for every play (C(strategy = vllm_fleet.fleet.warm_linear)). A play or
    C(ANSIBLE_STRATEGY) may still choose another strategy.
version_added: 0.9.0
author:
  - vllm-fleet contributors (!UNKNOWN)
notes:
  - Measured in docs/BENCHMARKS.md (a converged re-run of rollout.yml on 6 nodes).
"""

from ansible.plugins.loader import filter_loader, test_loader
from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule
from ansible.utils.display import Display

display = Display()

# One lookup loads every plugin of its kind: the first built-in one loads all built-in filters
# (or tests); the first of a collection imports every file of the collection's plugins/filter.
WARM = ((filter_loader, "ansible.builtin.to_json"), (test_loader, "ansible.builtin.match"),
        (filter_loader, "vllm_fleet.fleet.release_id"))


class StrategyModule(LinearStrategyModule):

    def run(self, iterator, play_context):
        for loader, name in WARM:
            try:
                loader.get(name)
            except Exception as exc:  # pylint: disable=broad-exception-caught
                # Only a head start: a worker that needs the plugin loads it, and reports what
                # fails where it is used.
                display.vvv(f"warm_linear: {loader.type} {name} not loaded ahead: {exc}")
        return super().run(iterator, play_context)
