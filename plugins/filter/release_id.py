# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: release_id
short_description: Name a release from its pinned set
version_added: "0.1.0"
description:
  - Returns the directory name of the release that a plan (C(vllm_fleet_release))
    installs under C(<vllm_fleet_root>/releases/), for example
    C(vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43).
  - The name is C(vllm-<vllm>_<cudnn_package>-<cudnn>), with the project name normalised
    (PEP 503) and both versions in their PEP 440 normal form, so the same pins always give
    the same name. C(_) separates the parts; neither names nor versions contain it.
  - torch is not part of the name. vLLM pins torch exactly, so the same vLLM means the
    same torch; the manifest of the release records what was resolved.
  - Validates the map and fails naming the bad key or value, an unknown key (a misspelt
    C(cudnnn) would otherwise install the wrong thing), a missing one, or a version that is a
    range instead of a pin.
positional: _input
options:
  _input:
    description: The release plan, a mapping with C(vllm), C(cudnn_package), C(cudnn) and optionally C(torch).
    type: dict
    required: true
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: Where the planned release lives
  ansible.builtin.debug:
    msg: "{{ vllm_fleet_root }}/releases/{{ vllm_fleet_release | vllm_fleet.fleet.release_id }}"
  # -> /opt/vllm-fleet/releases/vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43
"""

RETURN = r"""
_value:
  description: The release id, safe as a directory name.
  type: str
  sample: vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43
"""

from ansible.errors import AnsibleFilterError

# The module_utils are imported when the filter runs: to find one filter, Ansible imports (and
# compiles, collections have no .pyc) every filter file of the collection in each worker.


def release_id(release):
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import ReleaseError
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import release_id as _release_id

    try:
        return _release_id(release)
    except ReleaseError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"release_id": release_id}
