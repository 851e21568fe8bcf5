#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: node_state
short_description: Read in one run what a node is and serves (GPU, cuDNN, releases, profiles)
version_added: "0.1.0"
description:
  - One read-only round trip for what a rollout judges and decides from, instead of one
    module run each.
  - The GPU facts, as M(vllm_fleet.fleet.gpu_facts) sets them (C(ansible_facts.vllm_fleet_gpu)).
  - The cuDNN facts of the serving release (C(<root>/current)), as
    M(vllm_fleet.fleet.cudnn_facts) reports them with O(vllm_fleet.fleet.cudnn_facts#module:missing_ok=true).
  - The releases C(current) and C(known-good) point at, and the profiles recorded with them
    (C(<config_dir>/profile.json), C(<config_dir>/known-good/profile.json)).
  - Sets C(ansible_facts.vllm_fleet_gpu) and C(ansible_facts.vllm_fleet_node_state).
options:
  root:
    description: The fleet's root directory, holding C(releases/), C(current) and C(known-good).
    type: path
    required: true
  config_dir:
    description: The service's configuration directory, holding C(profile.json) and C(known-good/).
    type: path
    required: true
  cudnn:
    description:
      - Whether to probe the cuDNN of C(<root>/current) (subprocesses in that venv).
      - V(false) for a caller that needs only the links and profiles, such as a rollback away
        from a release that may not run; RV(ansible_facts.vllm_fleet_node_state.cudnn_current) is then V(null).
    type: bool
    default: true
  timeout:
    description: Seconds each cuDNN probe subprocess may take.
    type: int
    default: 60
  run_as:
    description:
      - Run the cuDNN probes (the release's own Python, third-party code) as this user instead of
        as the user that runs the module (root); see M(vllm_fleet.fleet.cudnn_facts).
    type: str
requirements:
  - packaging (the Python library) on the target's Python interpreter
  - nvidia-ml-py for the GPU facts (without it they say why, the task does not fail)
seealso:
  - module: vllm_fleet.fleet.gpu_facts
  - module: vllm_fleet.fleet.cudnn_facts
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the node once
  vllm_fleet.fleet.node_state:
    root: /opt/vllm-fleet
    config_dir: /etc/vllm

- name: Say what the node serves
  ansible.builtin.debug:
    msg: >-
      {{ ansible_facts.vllm_fleet_node_state.links.current or 'nothing' }} on
      {{ ansible_facts.vllm_fleet_gpu.device_count }} GPU(s), cuDNN
      {{ ansible_facts.vllm_fleet_node_state.cudnn_current.effective_version }}
"""

RETURN = r"""
ansible_facts:
  description: The facts set on the host.
  returned: always
  type: dict
  contains:
    vllm_fleet_gpu:
      description: The GPU facts, as M(vllm_fleet.fleet.gpu_facts) returns them.
      type: dict
    vllm_fleet_node_state:
      description: What the node serves.
      type: dict
      contains:
        cudnn_current:
          description: The cuDNN facts of C(<root>/current), as M(vllm_fleet.fleet.cudnn_facts) returns
            them (C(status=no_venv) before the first release),
            or V(null) with O(cudnn=false).
          type: dict
        links:
          description: The release id each link points at, V('') when the link is absent.
          type: dict
          sample: {"current": "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43", "known_good": ""}
        profile:
          description: The profile the node serves (C(profile.json)), V({}) when none is recorded.
          type: dict
        known_good_profile:
          description: The profile the known-good release passed with, V({}) when none is recorded.
          type: dict
        known_good_fingerprint:
          description:
            - The fingerprint of the configuration the known-good release passed with
              (C(known-good/fingerprint.json), see C(vllm_fleet.fleet.config_fingerprint)), V({}) when
              none is recorded. Digests only, never the API key.
          type: dict
        soaks_left:
          description:
            - The soaks under C(<root>/current/soak) that an interrupted rollout left running (no verdict, their
              writer alive), as M(vllm_fleet.fleet.soak_stop) finds them; V([]) when none.
          type: list
          elements: dict
          sample: [{"state_dir": "/opt/vllm-fleet/current/soak/20261204T120000Z-gpu0", "pid": 4242, "elapsed_s": 31.5}]
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import CudnnFactsError
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.node_state import NodeStateError, read_node_state
except ImportError as exc:
    # packaging is the one third-party import of module_utils; anything else missing is a bug.
    if (exc.name or "").split(".", maxsplit=1)[0] != "packaging":
        raise
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", required=True),
            config_dir=dict(type="path", required=True),
            cudnn=dict(type="bool", default=True),
            timeout=dict(type="int", default=60),
            run_as=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    if IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("packaging"), exception=IMPORT_ERROR)
    params = module.params
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be a positive number of seconds, not {params['timeout']}")
    try:
        gpu, state = read_node_state(params["root"], params["config_dir"], timeout=params["timeout"],
                                     probe_cudnn=params["cudnn"], user=params["run_as"])
    except (CudnnFactsError, NodeStateError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts={"vllm_fleet_gpu": gpu, "vllm_fleet_node_state": state})


if __name__ == "__main__":
    main()
