# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: served_names
short_description: The model names clients may ask a serving profile for
version_added: "0.1.0"
description:
  - Returns the names vLLM answers to for a profile (the shape of C(vllm_fleet_profile) and
    of the node's C(profile.json)), in order. These are the C(model) values clients send.
  - C(served-model-name) in C(serve_args) (as a string or a list; C(served_model_name) and
    C(--served-model-name) are the same flag), else the profile's C(model), which is vLLM's
    own default.
  - An empty or missing profile (a node that serves nothing yet) has no names.
positional: _input
options:
  _input:
    description: A serving profile, a mapping with C(model) and C(serve_args).
    type: dict
    required: true
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: What clients ask for after the rollout
  ansible.builtin.debug:
    msg: "{{ vllm_fleet_profile | vllm_fleet.fleet.served_names }}"
  # -> ['qwen3.6-35b-a3b']
"""

RETURN = r"""
_value:
  description: The served names, the first being the one vLLM reports.
  type: list
  elements: str
  sample: [qwen3.6-35b-a3b]
"""

from ansible.errors import AnsibleFilterError

# The module_utils are imported when the filter runs: to find one filter, Ansible imports (and
# compiles, collections have no .pyc) every filter file of the collection in each worker.


def served_names(profile):
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import served_names as _served_names

    try:
        return _served_names(profile)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"served_names": served_names}
