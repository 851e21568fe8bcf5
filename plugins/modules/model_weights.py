#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: model_weights
short_description: Stage, check or prune model weights on a node, side by side, verified per file
version_added: "0.3.0"
description:
  - A model is one directory C(<models_dir>/<name>@<revision>). O(state=present) stages it in
    C(.staging-<name>@<revision>) from a site mirror or the Hugging Face Hub, checks every
    file against its sha256 (or, for the Hub's small non-LFS files, its git blob id), writes
    the marker C(vllm-fleet-model.json) last and renames the directory into place. A model
    whose marker exists and whose files have their staged sizes is left alone (idempotent).
  - Free disk is checked against the declared size of the files before anything is downloaded,
    and each download stops at its declared size.
  - A failed staging leaves no C(.staging-) directory and no model directory behind.
  - O(state=verified) only reads - the model must be staged and complete - for the check
    before a node leaves traffic.
  - O(state=pruned) removes staged models other than O(protect) and those a configuration
    in O(config_dirs) names (the serving one and the known-good one), and leftovers of
    interrupted staging and pruning.
options:
  models_dir:
    description: Where models are staged (C(<vllm_fleet_root>/models)).
    type: path
    required: true
  state:
    description: Stage the model, only check it, or prune the others.
    type: str
    choices: [present, verified, pruned]
    default: present
  name:
    description: The model's directory name. Required unless O(state=pruned).
    type: str
  revision:
    description:
      - The pinned revision. A 40-hex commit for the Hub; the revision directory for a mirror.
      - Required unless O(state=pruned).
    type: str
  hub_repo:
    description: Stage from this Hugging Face Hub repository (C(owner/name)) instead of O(mirror).
    type: str
  hub_endpoint:
    description:
      - The Hub's URL (a site proxy); empty is huggingface_hub's default. No credentials in it
        (the token goes in O(hub_token_file)); C(http://) only with O(allow_http).
    type: str
    default: ""
  hub_token_file:
    description:
      - A file on the node, owned by root and mode 0600 or 0400, holding the Hub token. The
        token is never a parameter, so it never reaches argv, a log or a report.
    type: path
  mirror:
    description:
      - The site mirror - an absolute directory on the node or an http(s) URL - laid out
        C(<mirror>/<name>/<revision>/) with a C(SHA256SUMS) file as C(sha256sum) writes it and one
        C(# size <bytes>  <file>) line per file (C(stat -c '# size %s  %n' <files> >> SHA256SUMS)).
      - A download stops at the declared size; a file without one is refused. A redirect to
        another origin (scheme, host, port) is refused. A directory mirror's symbolic links
        are refused.
      - Give credentials in O(mirror_credentials), not here; a C(user:password@) here is used
        and masked in this module's output, but Ansible shows the parameter if another one is invalid.
    type: str
  mirror_credentials:
    description:
      - C(user:password) for the mirror's HTTP Basic authentication, percent-encoded as in a URL.
        Masked (C(no_log)) in every output.
    type: str
  allow_http:
    description: Accept a plain C(http://) O(mirror) or O(hub_endpoint) (files and credentials in the clear).
    type: bool
    default: false
  sha256sums_digest:
    description:
      - The sha256 of the mirror's C(SHA256SUMS) (C(sha256sum SHA256SUMS)) the profile was tested
        with; a mirror whose C(SHA256SUMS) has another is refused before any download.
    type: str
  reserve_gib:
    description: Disk space (GiB) that must stay free after the download.
    type: float
    default: 10
  timeout:
    description: Seconds to wait for the mirror to answer one request.
    type: int
    default: 60
  rehash:
    description: With O(state=verified), re-hash every file (slow for big models) instead of checking sizes.
    type: bool
    default: false
  protect:
    description: With O(state=pruned), model directories never removed.
    type: list
    elements: path
    default: []
  config_dirs:
    description: With O(state=pruned), directories whose C(*.yaml) configurations name models to keep.
    type: list
    elements: path
    default: []
requirements:
  - huggingface_hub on the node, for the Hub source only.
attributes:
  check_mode:
    support: full
    description: Reports what it would stage or remove; downloads and removes nothing.
  diff_mode:
    support: none
    description: The result says what was staged, kept and removed.
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Stage the profile's model from the site mirror
  vllm_fleet.fleet.model_weights:
    models_dir: /opt/vllm-fleet/models
    name: qwen3.6-35b-a3b-nvfp4
    revision: "2026-11-30"
    mirror: https://models.example.internal/vllm
    mirror_credentials: "{{ vault_model_mirror_credentials }}"
    sha256sums_digest: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855

- name: Stage it from the Hub at a pinned commit
  vllm_fleet.fleet.model_weights:
    models_dir: /opt/vllm-fleet/models
    name: qwen3.6-35b-a3b-nvfp4
    hub_repo: example-org/Qwen3.6-35B-A3B-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    hub_token_file: /etc/vllm-fleet/hf-token

- name: Refuse to drain a node whose model is not staged
  vllm_fleet.fleet.model_weights:
    models_dir: /opt/vllm-fleet/models
    name: qwen3.6-35b-a3b-nvfp4
    revision: "2026-11-30"
    state: verified
"""

RETURN = r"""
model:
  description: The model, unless O(state=pruned).
  returned: success
  type: dict
  contains:
    path:
      description: Its directory, what C(vllm serve) is given.
      type: str
      sample: /opt/vllm-fleet/models/qwen3.6-35b-a3b-nvfp4@2026-11-30
    files:
      description: How many files it has.
      type: int
      sample: 9
    bytes:
      description: Their total size.
      type: int
      sample: 21474836480
    source:
      description: Where it came from (no credentials).
      type: str
      sample: https://models.example.internal/vllm/qwen3.6-35b-a3b-nvfp4/2026-11-30
prune:
  description: With O(state=pruned), the model directories kept, removed (or that would be) and ignored.
  returned: success
  type: dict
  sample: {kept: ["qwen3.6-35b-a3b-nvfp4@2026-11-30"], removed: ["qwen3.6-35b-a3b-fp8@2026-09-01"], ignored: []}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.model_weights import (
    WEIGHTS_KEYS, HubSource, MirrorSource, WeightsError, check, check_model, prune, stage, url_secrets)

ARGUMENT_SPEC = dict(
    models_dir=dict(type="path", required=True),
    state=dict(type="str", choices=["present", "verified", "pruned"], default="present"),
    name=dict(type="str"),
    revision=dict(type="str"),
    hub_repo=dict(type="str"),
    hub_endpoint=dict(type="str", default=""),
    hub_token_file=dict(type="path"),
    mirror=dict(type="str"),
    mirror_credentials=dict(type="str", no_log=True),
    allow_http=dict(type="bool", default=False),
    sha256sums_digest=dict(type="str"),
    reserve_gib=dict(type="float", default=10),
    timeout=dict(type="int", default=60),
    rehash=dict(type="bool", default=False),
    protect=dict(type="list", elements="path", default=[]),
    config_dirs=dict(type="list", elements="path", default=[]),
)


def run(params: dict, check_mode: bool) -> dict:
    if params["state"] == "pruned":
        result = prune(params["models_dir"], params["protect"], params["config_dirs"], check_mode=check_mode)
        return {"changed": result.pop("changed"), "prune": result}
    weights = check_model({key: params[key] for key in WEIGHTS_KEYS if params[key] is not None},
                          where="model_weights")
    name, revision = weights["name"], weights["revision"]
    if params["state"] == "verified":
        found = check(params["models_dir"], name, revision, rehash=params["rehash"])
        if not found["verified"]:
            raise WeightsError(f"the model {name}@{revision} is not ready on this node: {'; '.join(found['problems'])}."
                               " Stage it first (the rollout's pre-stage does), before the node leaves traffic")
        return {"changed": False, "model": found}
    if weights.get("hub_repo"):
        source = HubSource(weights["hub_repo"], revision, endpoint=params["hub_endpoint"],
                           token_file=params["hub_token_file"], allow_http=params["allow_http"])
    elif params["mirror"]:
        source = MirrorSource(params["mirror"], name, revision, timeout=params["timeout"],
                              credentials=params["mirror_credentials"], allow_http=params["allow_http"],
                              sums_digest=weights.get("sha256sums_digest"))
    else:
        raise WeightsError(f"the model {name}@{revision} has no source: set vllm_fleet_model_mirror (a directory on"
                           " the node or an http(s) URL) or the profile's weights.hub_repo")
    result = stage(params["models_dir"], name, revision, source, check_mode=check_mode,
                   reserve_bytes=int(params["reserve_gib"] * 2**30))
    return {"changed": result.pop("changed"), "model": result}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           required_if=[("state", "present", ("name", "revision")),
                                        ("state", "verified", ("name", "revision"))],
                           mutually_exclusive=[("hub_repo", "mirror")])
    # A user:password@ in the mirror URL: masked in every output, as Ansible masks no_log values.
    module.no_log_values.update(url_secrets(module.params["mirror"] or ""))
    try:
        result = run(module.params, module.check_mode)
    except WeightsError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"model_weights under {module.params['models_dir']} failed: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
