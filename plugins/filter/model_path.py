# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: model_path
short_description: What vllm serve is given for a serving profile
version_added: "0.3.0"
description:
  - For a profile with C(weights) (a model the vllm_model role stages), its staged directory
    C(<models_dir>/<name>@<revision>); otherwise the profile's C(model).
positional: _input, models_dir
options:
  _input:
    description: A serving profile (the shape of C(vllm_fleet_profile)).
    type: dict
    required: true
  models_dir:
    description: Where staged models live on the node (C(vllm_fleet_models_dir)).
    type: str
    required: true
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: The model directory the soak's load generator reads the tokenizer from
  ansible.builtin.debug:
    msg: "{{ vllm_fleet_profile | vllm_fleet.fleet.model_path(vllm_fleet_models_dir) }}"
  # -> /opt/vllm-fleet/models/qwen3.6-35b-a3b-nvfp4@2026-11-30
"""

RETURN = r"""
_value:
  description: The model path or id.
  type: str
"""

from ansible.errors import AnsibleFilterError

# The module_utils are imported when the filter runs: to find one filter, Ansible imports (and
# compiles, collections have no .pyc) every filter file of the collection in each worker.


def model_path(profile, models_dir):
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import model_path as _model_path

    try:
        return _model_path(profile, models_dir)
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"model_path: {profile!r:.200} is not a profile with model or weights ({exc})") from None


class FilterModule:
    def filters(self):
        return {"model_path": model_path}
