#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: release_verify
short_description: Re-hash an installed vLLM release and report what drifted
version_added: "0.1.0"
description:
  - Re-hashes every file of a release venv (C(<root>/releases/<id>), see docs/CONTRACTS.md)
    against the RECORD of the dist that installed it (pip and uv write the sha256 of each file
    there), and compares the installed dists with the release's lock or manifest.
  - Reports, per dist, the files whose hash changed, the files missing, and the files under
    site-packages that no RECORD names (byte code in C(__pycache__) and the two files
    C(uv venv) writes, C(_virtualenv.py) and C(_virtualenv.pth), aside); and the dists missing,
    not expected, or at another version.
  - Reads only; drift is reported in RV(verify.ok), not as a failed task, so the caller decides.
options:
  path:
    description:
      - The release venv, for example C(/opt/vllm-fleet/releases/<id>) or C(/opt/vllm-fleet/current).
    type: path
    required: true
  lock:
    description:
      - A hashed lock (C(uv pip compile --generate-hashes) output) whose packages are the expected
        set, for a venv that has no manifest yet (a build in staging).
      - Without it, the expected set is the C(packages) of C(<path>/vllm-fleet-release.json).
    type: path
seealso:
  - module: vllm_fleet.fleet.release_prune
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Re-hash the serving release against its manifest
  vllm_fleet.fleet.release_verify:
    path: /opt/vllm-fleet/current
  register: verified

- name: Stop on drift
  ansible.builtin.assert:
    that: verified.verify.ok
    fail_msg: "{{ verified.msg }}"
"""

RETURN = r"""
verify:
  description: What was compared and what differs.
  returned: success
  type: dict
  contains:
    ok:
      description: V(true) when the dists are the expected ones and every file matches its RECORD.
      type: bool
    packages:
      description: C(missing) and C(extra) (C(name==version) lists) and C(other_version) (sentences).
      type: dict
      sample: {missing: [], extra: [evil==1.0], other_version: []}
    files:
      description: Each dist with drift, with its C(changed), C(missing) and C(added) paths (relative to the venv).
      type: dict
      sample: {vllm: {changed: [lib/python3.11/site-packages/vllm/__init__.py], missing: [], added: []}}
    checked:
      description: How many files were re-hashed.
      type: int
      sample: 412
    message:
      description: One readable sentence, naming every difference.
      type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.release_verify import VerifyError, verify_venv
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import MANIFEST_NAME, ReleaseError, parse_lock

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    lock=dict(type="path"),
)


def expected_packages(path, lock):
    """The expected set: the lock's packages, else the manifest's."""
    if lock:
        with open(lock, encoding="utf-8") as handle:
            return parse_lock(handle.read())
    manifest = os.path.join(path, MANIFEST_NAME)
    with open(manifest, encoding="utf-8") as handle:
        packages = json.load(handle).get("packages")
    if not isinstance(packages, list) or not packages:
        raise ReleaseError(f"{manifest} lists no packages: it was not written by the vllm_runtime role")
    return packages


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    path, lock = module.params["path"], module.params["lock"]
    try:
        result = verify_venv(path, expected_packages(path, lock))
    except (ReleaseError, VerifyError, ValueError) as exc:
        module.fail_json(msg=f"cannot verify {path}: {exc}")
    except OSError as exc:
        module.fail_json(msg=f"cannot verify {path}: {exc.strerror}: {exc.filename}")
    module.exit_json(changed=False, verify=result, msg=result["message"])


if __name__ == "__main__":
    main()
