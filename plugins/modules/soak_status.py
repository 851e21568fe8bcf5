#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: soak_status
short_description: Read the progress and the verdict of a soak running on the node
version_added: "0.1.0"
description:
  - Reads the last line of C(progress.jsonl) and, once written, C(verdict.json) from the
    O(state_dir) of a M(vllm_fleet.fleet.soak) started with C(async) and C(poll) set to 0.
  - With O(wait_s), waits on the node up to that long and returns the latest progress,
    or earlier as soon as the verdict is written (or the soak's process is gone), so a
    playbook loop prints progress every O(wait_s) and sees the end within a second.
  - Only reads; it never fails because the soak failed (look at RV(passed)).
options:
  state_dir:
    description: The soak's O(vllm_fleet.fleet.soak#module:state_dir).
    type: path
    required: true
  wait_s:
    description:
      - Seconds to wait before returning the latest progress; the verdict (or the soak's
        process going away) ends the wait early. 0 returns at once.
    type: float
    default: 0
notes:
  - RV(running) is V(false) while RV(done) is V(false) when the soak's process is gone
    without a verdict (killed, or its async time ran out); stop waiting and read
    M(ansible.builtin.async_status).
seealso:
  - module: vllm_fleet.fleet.soak
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Soak progress
  vllm_fleet.fleet.soak_status:
    state_dir: "{{ soak_state_dir }}"
    wait_s: 20
  register: soak_progress

- name: Show it
  ansible.builtin.debug:
    msg: >-
      {{ inventory_hostname }} soak {{ soak_progress.progress.elapsed_s }} s:
      {{ soak_progress.progress.tokens_per_s }} tokens/s,
      {{ soak_progress.progress.crashes }} crash(es), {{ soak_progress.progress.wedges }} wedge(s)
  when: soak_progress.started
"""

RETURN = r"""
started:
  description: The soak has written at least one progress line.
  returned: always
  type: bool
done:
  description: The verdict is written.
  returned: always
  type: bool
passed:
  description: The verdict's C(passed), V(null) until RV(done).
  returned: always
  type: bool
running:
  description: The soak's process is alive (V(null) before it started).
  returned: always
  type: bool
age_s:
  description: Seconds since the last progress line.
  returned: always
  type: float
progress:
  description: The last progress line; V(null) before the first.
  returned: always
  type: dict
  contains:
    elapsed_s:
      description: Seconds of soak so far.
      type: float
    tokens_per_s:
      description: Prompt + generated tokens per second over the last 30 s, from C(/metrics).
      type: float
    crashes:
      description: Crashes so far.
      type: int
    wedges:
      description: Wedges so far.
      type: int
    failed:
      description: Failed requests so far (counted as each load run finishes).
      type: int
    phase:
      description: V(waiting_ready), V(soak) or V(done).
      type: str
    kv_usage:
      description: Current C(vllm:kv_cache_usage_perc).
      type: float
    kv_peak:
      description: Peak C(vllm:kv_cache_usage_perc) so far.
      type: float
  sample: {elapsed_s: 184.3, tokens_per_s: 14120.5, crashes: 0, wedges: 0, failed: 0, phase: soak}
verdict:
  description: The contents of C(verdict.json) (see RV(vllm_fleet.fleet.soak#module:soak)); V(null) until RV(done).
  returned: always
  type: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import read_status


def main():
    module = AnsibleModule(
        argument_spec=dict(state_dir=dict(type="path", required=True), wait_s=dict(type="float", default=0)),
        supports_check_mode=True,
    )
    state_dir, wait_s = module.params["state_dir"], module.params["wait_s"]
    if wait_s < 0:
        module.fail_json(msg=f"soak_status: wait_s must be >= 0, got {wait_s}")
    status = read_status(state_dir)
    deadline = time.monotonic() + wait_s
    while not status["done"] and status["running"] is not False and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        status = read_status(state_dir)
    module.exit_json(changed=False, **status)


if __name__ == "__main__":
    main()
