#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: cudnn_facts
short_description: Report the cuDNN a Python venv installs, ships and actually loads
version_added: "0.1.0"
description:
  - Inspects one venv (a release of the serving stack) by running the venv's own
    interpreter, C(<venv>/bin/python), in subprocesses; nothing from the venv is
    imported into the module.
  - Reports the installed C(nvidia-cudnn-cu13) / C(nvidia-cudnn-cu12) wheels, the
    version their C(libcudnn.so.9) itself reports (C(cudnnGetVersion)), and the cuDNN
    that torch says it loaded (C(torch.backends.cudnn.version)), plus the torch and vllm
    versions.
  - The three are compared on C(major.minor.patch). They differ when cuDNN was
    overridden above torch's pin without the library taking effect, or when cu12 and
    cu13 wheels overwrote each other's files.
  - A broken library that aborts or hangs is reported in RV(cudnn.library_error) or
    RV(cudnn.torch_error), not as a failed task.
  - Returns the result under C(cudnn) (register it); sets no host facts.
options:
  venv:
    description:
      - Path of the venv to inspect, for example C(/opt/vllm-fleet/releases/<id>) or
        C(/opt/vllm-fleet/current).
      - The task fails when the path is not a venv (no C(pyvenv.cfg)) or its
        C(bin/python) cannot run, and when it does not exist unless O(missing_ok=true).
    type: path
    required: true
  timeout:
    description:
      - Seconds each probe subprocess may take (listing, library, torch import).
    type: int
    default: 60
  missing_ok:
    description:
      - When V(true), a venv path that does not exist returns RV(cudnn.status=no_venv)
        instead of failing the task (for example before the first release).
    type: bool
    default: false
  run_as:
    description:
      - Run the probes (the venv's own Python, third-party code) as this user, with its
        own group and no other, instead of as the user that runs the module (root).
      - The user must exist and be able to read the venv; the module must run as root
        to switch.
    type: str
requirements:
  - packaging (the Python library) on the target's Python interpreter
notes:
  - The venv may use another Python than the one that runs the module.
  - The library probe calls C(cudnnGetVersion) only; it needs no GPU.
seealso:
  - module: vllm_fleet.fleet.gpu_facts
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the cuDNN of the release being installed
  vllm_fleet.fleet.cudnn_facts:
    venv: /opt/vllm-fleet/releases/{{ release_id }}
  register: planned

- name: Stop when torch does not load the cuDNN the override installed
  ansible.builtin.assert:
    that:
      - planned.cudnn.status == 'ok'
      - planned.cudnn.effective_version is version('9.23.1', '>=')
    fail_msg: "{{ planned.cudnn.message }}"

- name: Read the cuDNN of the running release, if there is one yet
  vllm_fleet.fleet.cudnn_facts:
    venv: /opt/vllm-fleet/current
    missing_ok: true
  register: current
"""

RETURN = r"""
cudnn:
  description: The cuDNN facts of the venv (docs/CONTRACTS.md).
  returned: always
  type: dict
  contains:
    venv:
      description: Absolute path of the venv.
      type: str
      sample: /opt/vllm-fleet/releases/r42
    python:
      description: The venv's interpreter that ran the probes; V(null) when RV(cudnn.status=no_venv).
      type: str
      sample: /opt/vllm-fleet/releases/r42/bin/python
    wheels:
      description: The cuDNN wheels installed, C(nvidia-cudnn-cu13) first.
      type: list
      elements: dict
      contains:
        name:
          description: Distribution name.
          type: str
          sample: nvidia-cudnn-cu13
        version:
          description: Wheel version.
          type: str
          sample: 9.24.0.43
        library_path:
          description: Where the wheel installed C(libcudnn.so.9), V(null) if it has none.
          type: str
          sample: /opt/vllm-fleet/releases/r42/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9
    library_path:
      description: The C(libcudnn.so.9) probed (the first wheel's), or V(null).
      type: str
    library_version:
      description: The version the library reports, C(major.minor.patch), or V(null).
      type: str
      sample: 9.24.0
    library_version_raw:
      description: What C(cudnnGetVersion) returned, C(MAJOR*10000+MINOR*100+PATCH).
      type: int
      sample: 92400
    library_error:
      description: Why the library probe gave no version (load error, signal such as
        C(SIGABRT), timeout), or V(null).
      type: str
      sample: "loading .../libcudnn.so.9 was killed by SIGABRT: no output"
    torch_version:
      description: Installed torch version, or V(null) when torch is not installed.
      type: str
      sample: 2.11.0
    torch_cudnn_version:
      description: The cuDNN version torch reports it loaded, or V(null).
      type: str
      sample: 9.24.0
    torch_cudnn_version_raw:
      description: What C(torch.backends.cudnn.version) returned.
      type: int
      sample: 92400
    torch_error:
      description: Why an installed torch gave no cuDNN version (import error, signal,
        timeout, no cuDNN), or V(null).
      type: str
    vllm_version:
      description: Installed vllm version, or V(null).
      type: str
      sample: 0.25.1
    effective_version:
      description: The cuDNN that counts, C(major.minor.patch) - torch's answer, else the
        library's, else the wheel's; V(null) when there is none.
      type: str
      sample: 9.24.0
    effective_source:
      description: Where RV(cudnn.effective_version) came from.
      type: str
      choices: [torch, library, wheel]
      sample: torch
    mismatch:
      description: The wheel, library and torch versions that are known disagree
        (compared on C(major.minor.patch)).
      type: bool
      sample: false
    mismatch_detail:
      description: A sentence naming each version when RV(cudnn.mismatch), else V(null).
      type: str
      sample: "cuDNN versions disagree: the nvidia-cudnn-cu13 wheel is 9.24.0.43, torch 2.11.0 loads cuDNN 9.19.0."
    status:
      description:
        - V(ok) torch answered and everything known agrees.
        - V(mismatch) see RV(cudnn.mismatch_detail).
        - V(no_torch) there is cuDNN, but no torch answered (not installed, or its
          probe failed - see RV(cudnn.torch_error)).
        - V(no_cudnn) no cuDNN wheel and no cuDNN from torch.
        - V(no_venv) the venv does not exist and O(missing_ok=true).
      type: str
      choices: [ok, mismatch, no_torch, no_cudnn, no_venv]
      sample: ok
    message:
      description: One readable sentence summing it up.
      type: str
      sample: torch 2.11.0 in /opt/vllm-fleet/releases/r42 loads cuDNN 9.24.0 from nvidia-cudnn-cu13 9.24.0.43.
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import (
        CudnnFactsError,
        VenvNotFoundError,
        absent_venv_facts,
        collect_cudnn_facts,
    )
except ImportError as exc:
    # packaging is the one third-party import of module_utils; anything else missing is a bug.
    if (exc.name or "").split(".", maxsplit=1)[0] != "packaging":
        raise
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None

ARGUMENT_SPEC = dict(
    venv=dict(type="path", required=True),
    timeout=dict(type="int", default=60),
    missing_ok=dict(type="bool", default=False),
    run_as=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("packaging"), exception=IMPORT_ERROR)
    venv, timeout = module.params["venv"], module.params["timeout"]
    if timeout <= 0:
        module.fail_json(msg=f"timeout must be a positive number of seconds, not {timeout}")

    try:
        facts = collect_cudnn_facts(venv, timeout=timeout, user=module.params["run_as"])
    except VenvNotFoundError as exc:
        if not module.params["missing_ok"]:
            module.fail_json(
                msg=f"{exc}: install the release there first, or pass the path of an existing"
                " venv; set missing_ok: true to report status no_venv instead of failing"
            )
        facts = absent_venv_facts(venv)
    except CudnnFactsError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, cudnn=facts)


if __name__ == "__main__":
    main()
