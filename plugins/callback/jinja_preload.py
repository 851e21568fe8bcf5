# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""vllm_fleet.fleet.jinja_preload: load the Jinja plugins in the controller once, before Ansible
forks the workers that template, so each worker inherits them instead of loading them itself."""
from __future__ import annotations

DOCUMENTATION = r"""
name: jinja_preload
type: aggregate
short_description: Load the Jinja plugins once in the controller, before the workers fork
description:
  - Prints nothing and changes no result. When a playbook starts, the controller loads every
    built-in filter and test and this collection's filters.
  - Ansible forks a worker per host per task, and each worker that templates a filter or a test
    otherwise loads them itself and discards them when it exits. That costs about 6 ms of CPU
    for the built-in ones and 5 ms for this collection's, whose files the collection loader
    compiles from source. Forked after the load, every worker inherits it.
  - ansible-core has no setting to keep them for the run (ansible/ansible#79781). A callback is
    the supported plugin type that runs in the controller when a playbook starts.
  - C(ansible.cfg) enables it (C(callbacks_enabled)). Without it, runs behave the same, only slower.
version_added: 0.1.0
author:
  - vllm-fleet contributors (!UNKNOWN)
requirements:
  - enabled in C(callbacks_enabled) (C(ANSIBLE_CALLBACKS_ENABLED))
notes:
  - Measured in docs/BENCHMARKS.md (a converged re-run of rollout.yml).
"""

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

# One lookup loads every plugin of its kind: the first built-in filter loads all of them (as the
# first built-in test does the tests); the first of this collection imports every file of its
# plugins/filter.
PRELOAD = ((filter_loader, "ansible.builtin.to_json"), (test_loader, "ansible.builtin.match"),
           (filter_loader, "vllm_fleet.fleet.release_id"))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vllm_fleet.fleet.jinja_preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        for loader, name in PRELOAD:
            try:
                loader.get(name)
            except Exception as exc:  # pylint: disable=broad-exception-caught
                # Only a head start: a worker that needs the plugin loads it, and reports what
                # fails where it is used.
                self._display.vvv(f"jinja_preload: {loader.type} {name} not loaded ahead: {exc}")
