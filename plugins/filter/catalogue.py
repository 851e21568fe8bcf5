# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: catalogue
short_description: Read the known-issues catalogue from a file on the controller
version_added: "0.1.0"
description:
  - Reads the YAML file at the given path (C(vllm_fleet_catalogue_path)) on the controller
    and returns its data, for the C(catalogue) option of the preflight module and of the
    roles that judge a plan.
  - Fails naming the file when it cannot be read or is not YAML (with the line and column
    of the first error); the catalogue's schema is checked by the modules that use it.
  - Reads with the collection's strict loader (see the yaml_file filter) - no anchors or
    aliases, no duplicate keys, at most 1 MiB - before any module runs.
positional: _input
options:
  _input:
    description: Path of the catalogue file on the controller.
    type: path
    required: true
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: Judge the plan against the catalogue
  vllm_fleet.fleet.preflight:
    catalogue: "{{ vllm_fleet_catalogue_path | vllm_fleet.fleet.catalogue }}"
    gpu: "{{ ansible_facts.vllm_fleet_gpu }}"
"""

RETURN = r"""
_value:
  description: The catalogue's data, as the file holds it.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.strict_yaml import StrictYAMLError, load_file


def catalogue(path):
    try:
        return load_file(path)
    except StrictYAMLError as exc:
        raise AnsibleFilterError(
            f"vllm_fleet_catalogue_path: {exc}. "
            "Fix the file or point vllm_fleet_catalogue_path at the catalogue (catalogue/known_issues.yml)"
        ) from None


class FilterModule:
    def filters(self):
        return {"catalogue": catalogue}
