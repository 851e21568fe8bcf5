# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: config_fingerprint
short_description: Fingerprint a node's service configuration without holding its secrets
version_added: "0.1.0"
description:
  - One digest per file (owner, group, mode and bytes) of the files M(vllm_fleet.fleet.config_files)
    writes, for the record of the configuration a known-good release passed with.
  - The files named in O(secret_paths) (the API key file) are digested with HMAC-SHA256 under
    O(salt), so the record never holds the key. C(vllm_fleet.fleet.config_drift) compares a record
    with what would be written now.
positional: _input, secret_paths, salt
options:
  _input:
    description: File entries, each with C(path), C(content), C(owner), C(group) and C(mode).
    type: list
    elements: dict
    required: true
  secret_paths:
    description: The paths digested with the salt.
    type: list
    elements: str
    default: []
  salt:
    description: 32 to 128 lowercase hex digits; a new random one when omitted.
    type: str
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: Fingerprint the service configuration
  ansible.builtin.set_fact:
    fingerprint: "{{ files | vllm_fleet.fleet.config_fingerprint(['/etc/vllm-fleet/api-key.env']) }}"
"""

RETURN = r"""
_value:
  description: C(version), C(salt) and C(files) (path to C(sha256:...) or C(hmac-sha256:...)).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import config_fingerprint as _fingerprint


def config_fingerprint(files, secret_paths=(), salt=None):
    try:
        return _fingerprint.fingerprint(files, list(secret_paths), salt)
    except _fingerprint.FingerprintError as exc:
        raise AnsibleFilterError(f"config_fingerprint: {exc}") from None


def config_drift(files, secret_paths, recorded):
    try:
        return _fingerprint.drift(files, list(secret_paths), recorded)
    except _fingerprint.FingerprintError as exc:
        raise AnsibleFilterError(f"config_drift: {exc}") from None


class FilterModule:
    def filters(self):
        return {"config_fingerprint": config_fingerprint, "config_drift": config_drift}
