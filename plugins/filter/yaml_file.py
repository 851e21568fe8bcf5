# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: yaml_file
short_description: Read a YAML file on the controller with the collection's strict loader
version_added: "0.1.0"
description:
  - Reads the YAML file at the given path on the controller and returns its data. Used for the
    serve-args schema and the profiles (the catalogue has its own filter, C(catalogue)).
  - Refuses, naming the variable, the file and the line, an anchor or alias (a few hundred bytes
    of aliases expand to hundreds of MB), a merge key, a duplicate key (YAML would keep the last
    one silently) and a file over I(max_bytes); before any module runs.
positional: _input
options:
  _input:
    description: Path of the file on the controller.
    type: path
    required: true
  what:
    description: The variable that names the file, for the message.
    type: str
    default: the file
  max_bytes:
    description: The largest file read.
    type: int
    default: 1048576
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: Validate the profile against the schema
  vllm_fleet.fleet.serve_config:
    schema: "{{ vllm_fleet_service_schema_path | vllm_fleet.fleet.yaml_file('vllm_fleet_service_schema_path') }}"
    profile: "{{ vllm_fleet_profile }}"
"""

RETURN = r"""
_value:
  description: The file's data.
  type: raw
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.strict_yaml import (
    MAX_BYTES,
    StrictYAMLError,
    load_file,
)


def yaml_file(path, what="the file", max_bytes=MAX_BYTES):
    try:
        return load_file(str(path), max_bytes=int(max_bytes))
    except StrictYAMLError as exc:
        raise AnsibleFilterError(f"{what}: {exc}") from None


class FilterModule:
    def filters(self):
        return {"yaml_file": yaml_file}
