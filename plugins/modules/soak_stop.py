#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: soak_stop
short_description: Stop the soaks an interrupted rollout left running on a node
version_added: "0.3.0"
description:
  - A soak (M(vllm_fleet.fleet.soak)) runs detached on the node; when the controller that
    started it is killed (SIGINT, SIGKILL) nothing collects it, and it goes on loading the
    drained node. This finds every soak run directory under O(path) without a verdict whose
    writer (the pid in its last progress line) still runs the soak, stops its process group
    (Ansible's async wrapper, the soak and its C(vllm bench serve)) with SIGTERM, then SIGKILL
    after O(timeout), and, unless the soak wrote one as it stopped, writes its C(verdict.json)
    (V(passed=false), V(stopped=interrupted)) so the evidence stays readable.
  - A soak whose writer is gone, or that wrote its verdict, is left as it is.
options:
  path:
    description: The directory holding the soak run directories (the serving release's C(soak/)).
    type: path
    required: true
  timeout:
    description: Seconds to wait after SIGTERM before SIGKILL.
    type: float
    default: 10
seealso:
  - module: vllm_fleet.fleet.soak
  - module: vllm_fleet.fleet.soak_status
attributes:
  check_mode:
    support: full
    description: Reports the soaks it would stop, and stops none.
  diff_mode:
    support: none
    description: Nothing to diff.
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Stop a soak that an interrupted rollout left on the node
  vllm_fleet.fleet.soak_stop:
    path: /opt/vllm-fleet/current/soak
  register: leftover
"""

RETURN = r"""
stopped:
  description: Each soak stopped (in check mode, that would be), with the signal that ended it.
  type: list
  elements: dict
  returned: always
  sample: [{state_dir: /opt/vllm-fleet/current/soak/20261204T172612Z-gpu0, pid: 1234, elapsed_s: 310.2, signal: SIGTERM}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stop import orphans, stop


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True), timeout=dict(type="float", default=10.0)),
        supports_check_mode=True,
    )
    found = orphans(module.params["path"])
    if module.check_mode or not found:
        module.exit_json(changed=bool(found), stopped=found)
    try:
        stopped = [stop(item, module.params["timeout"]) for item in found]
    except OSError as exc:
        module.fail_json(msg="cannot stop the soak left in %s: %s. Stop its process by hand (kill the process "
                             "group of the pid in its progress.jsonl) and run again." % (found[0]["state_dir"], exc),
                         stopped=[])
    module.exit_json(changed=True, stopped=stopped)


if __name__ == "__main__":
    main()
