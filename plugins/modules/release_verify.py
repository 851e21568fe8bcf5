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
  - Returns the parsed manifest (RV(manifest)). With O(probe), the same run also reports what
    the release's own code says, run as O(run_as), the cuDNN facts of the release as
    M(vllm_fleet.fleet.cudnn_facts) reports them (RV(cudnn)) and the version of vllm the release's
    own Python imports (RV(vllm_version)), so that one module run verifies one release. The probes
    run before the re-hash, which so also sees what they changed.
  - The version probe runs C(<path>/bin/python -I), which imports vllm (and so torch) as the server
    does and reads C(vllm.__version__), the installed dist's version (C(importlib.metadata)) and the
    file imported, which must lie in the release. Not C(vllm --version), because in vLLM 0.25.1 it
    builds C(serve)'s parser first, whose EngineArgs defaults raise "Failed to infer device type"
    unless NVML finds a GPU (vllm/entrypoints/cli/main.py lines 85-90, vllm/config/device.py lines
    49-59, vllm/platforms/__init__.py lines 59-107). It fails on a CPU machine (run) and on a GPU
    node whose driver is not loaded or whose device nodes the probe user may not open (read from
    the source); on a GPU node with a loaded driver it works.
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
  missing_ok:
    description:
      - When V(true), a release without a usable manifest (none, as before its install; unreadable;
        not JSON; no packages) and no O(lock) returns RV(installed), RV(manifest_error) and
        RV(verify=null) instead of failing, and runs none of its code; the caller decides
        (install it, or fail naming RV(manifest_error)).
    type: bool
    default: false
  rehash:
    description:
      - Re-hash the files and compare the dists (RV(verify)). V(false) for a release whose files
        were just re-hashed (in staging, before its rename) and whose probes are all that is asked.
    type: bool
    default: true
  probe:
    description:
      - What of the release's own code to run, as O(run_as), each in its own subprocess.
      - V(cudnn) the probes of M(vllm_fleet.fleet.cudnn_facts) (RV(cudnn)); V(vllm_version)
        the release's Python importing vllm (RV(vllm_version)).
    type: list
    elements: str
    choices: [cudnn, vllm_version]
    default: []
  run_as:
    description:
      - Run the probes (third-party code) as this user, with its own group and no other, instead
        of as the user that runs the module (root). The user must exist and be able to read the
        release; the module must run as root to switch.
    type: str
  timeout:
    description:
      - Seconds each probe subprocess may take.
    type: int
    default: 60
requirements:
  - packaging (the Python library) on the target's Python interpreter, for O(probe=[cudnn])
seealso:
  - module: vllm_fleet.fleet.cudnn_facts
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

- name: Read, probe and re-hash a release in one run, if it is installed
  vllm_fleet.fleet.release_verify:
    path: /opt/vllm-fleet/releases/{{ release_id }}
    missing_ok: true
    probe: [cudnn, vllm_version]
    run_as: nobody
  register: release

- name: Stop unless the release imports the vllm it was built with
  ansible.builtin.assert:
    that:
      - release.vllm_version.error is none
      - release.vllm_version.version == '0.25.1'
      - release.vllm_version.metadata == '0.25.1'
    fail_msg: "{{ release.vllm_version }}"
  when: release.vllm_version is not none
"""

RETURN = r"""
installed:
  description: V(true) when C(<path>/vllm-fleet-release.json) exists (the vllm_runtime role writes it last).
  returned: success
  type: bool
manifest:
  description: The parsed C(<path>/vllm-fleet-release.json), or V(null) (see RV(manifest_error)).
  returned: success
  type: dict
  sample: {release_id: vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43, override: {intended: true}}
manifest_error:
  description: Why there is no usable manifest (none, unreadable, not JSON, no packages), or V(null).
  returned: success
  type: str
  sample: no manifest /opt/vllm-fleet/releases/r42/vllm-fleet-release.json (not installed, or its build did not finish)
cudnn:
  description:
    - The cuDNN facts of the release, as RV(vllm_fleet.fleet.cudnn_facts#module:cudnn) returns them.
    - V(null) unless O(probe) holds V(cudnn) and there was a usable manifest or O(lock).
  returned: success
  type: dict
  sample: {status: ok, effective_version: 9.24.0, torch_cudnn_version: 9.24.0, message: torch 2.11.0 in ... loads cuDNN 9.24.0.}
vllm_version:
  description:
    - What the release's Python says of vllm, run as O(run_as).
    - V(null) unless O(probe) holds V(vllm_version) and there was a usable manifest or O(lock).
  returned: success
  type: dict
  contains:
    version:
      description: C(vllm.__version__) as imported; V(null) when the import failed.
      type: str
      sample: 0.25.1
    metadata:
      description: The installed dist's version (C(importlib.metadata.version("vllm"))); V(null) when the import failed.
      type: str
      sample: 0.25.1
    module:
      description: The file imported as vllm (links resolved).
      type: str
      sample: /opt/vllm-fleet/releases/vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43/lib/python3.11/site-packages/vllm/__init__.py
    error:
      description: Why it failed (the import, a timeout), or that vllm was imported from outside the release; V(null) otherwise.
      type: str
    error:
      description: Why it gave no output (timeout, exit status or signal, with the last line of stderr), or V(null).
      type: str
      sample: "/opt/vllm-fleet/releases/r42/bin/vllm --version failed (exit status 1): ModuleNotFoundError: No module named 'torch'"
verify:
  description: What was compared and what differs; V(null) with O(rehash=false), or when O(missing_ok) found no usable manifest.
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

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.identity import IdentityError
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.release_verify import PROBES, VerifyError, check_release
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import ReleaseError

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    lock=dict(type="path"),
    missing_ok=dict(type="bool", default=False),
    rehash=dict(type="bool", default=True),
    probe=dict(type="list", elements="str", choices=list(PROBES), default=[]),
    run_as=dict(type="str"),
    timeout=dict(type="int", default=60),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    path = params["path"]
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be a positive number of seconds, not {params['timeout']}")
    try:
        result = check_release(path, lock=params["lock"], missing_ok=params["missing_ok"], rehash=params["rehash"],
                               probes=params["probe"], user=params["run_as"], timeout=params["timeout"])
    except ImportError as exc:
        # packaging (for the cuDNN probe) is the one third-party import; anything else missing is a bug.
        if (exc.name or "").split(".", maxsplit=1)[0] != "packaging":
            raise
        module.fail_json(msg=missing_required_lib("packaging"), exception=traceback.format_exc())
    except (ReleaseError, VerifyError, IdentityError, ValueError) as exc:
        module.fail_json(msg=f"cannot verify {path}: {exc}")
    except OSError as exc:
        module.fail_json(msg=f"cannot verify {path}: {exc.strerror}: {exc.filename}")
    module.exit_json(changed=False, msg=result.pop("message"), **result)


if __name__ == "__main__":
    main()
