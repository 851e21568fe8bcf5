#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: serve_config
short_description: Validate a vLLM serving profile and render its vllm serve --config YAML and environment file
version_added: "0.1.0"
description:
  - Checks a serving profile (C(name), C(model), C(serve_args), C(env); see C(profiles/)) against
    a schema of C(vllm serve) flags (C(catalogue/vllm_serve_args.yml), data an operator can extend)
    and fails with every problem at once, one line each, before anything is written.
  - An unknown flag is named with the closest known one (C(--enable-prefix-cache) gives
    I(did you mean --enable-prefix-caching?)); a wrong type, a value out of range or not among the
    choices, a flag the role owns (C(port), C(host), C(api-key), C(model)) and an environment value
    that is not text each fail with the reason.
  - Renders the C(vllm serve --config) mapping with the model first. C(vllm serve --config) drops a
    false boolean silently, so a false is written as the key C(no-<flag>) set to true for flags that
    have that form; a false on a flag without one is refused.
  - Returns the YAML text and the systemd C(EnvironmentFile=) text; it writes no file itself (the
    service role copies them), so it changes nothing and runs the same in check mode.
  - The YAML is one line per flag, the key then its value as JSON, which any YAML loader reads back
    exactly; no YAML library is needed on the node.
  - Runs on the controller (an action plugin); nothing is sent to the node.
options:
  schema:
    description:
      - The parsed serve-args schema, a mapping with C(schema_version), C(vllm), C(flags) and
        optionally C(env.known); read C(catalogue/vllm_serve_args.yml) on the controller with the
        C(ansible.builtin.file) lookup and the C(from_yaml) filter.
      - A schema that does not follow its format fails the task naming the flag and key.
    type: raw
    required: true
  profile:
    description:
      - The serving profile. C(name) is a required string, and C(model) (a path or id the site
        provides) or C(weights) - C(name), C(revision) and optionally C(hub_repo) of a model the
        vllm_model role stages under O(models_dir), served from there; C(serve_args) maps long
        C(vllm serve) flag names (C(kv-cache-dtype), C(--kv_cache_dtype) or C(no-enforce-eager))
        to values; C(env) maps environment variable names to text; C(description) is free text.
      - Any other key fails (a misspelt C(serve-args) would otherwise serve the defaults).
    type: dict
    required: true
  role_args:
    description:
      - Flags the caller sets for this instance (for example C(host) and C(port)), written after
        the profile's. They may be flags the schema reserves; a profile that sets one fails.
    type: dict
    default: {}
  role_env:
    description:
      - Environment variables the caller sets for this instance (for example
        C(CUDA_VISIBLE_DEVICES)), written after the profile's. A profile that sets one fails.
    type: dict
    default: {}
  reserved_env:
    description:
      - More variable names a profile may not set, each mapped to the reason (shown in the error),
        for example C(VLLM_API_KEY) or the cache directories the unit sets.
    type: dict
    default: {}
  header:
    description:
      - Text put at the top of both files as C(#) comment lines.
    type: str
    default: ""
  models_dir:
    description:
      - Where staged models live on the node (C(vllm_fleet_models_dir)); a profile with
        C(weights) serves C(<models_dir>/<name>@<revision>).
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Only computes; it runs the same in check mode.
  diff_mode:
    support: none
    description: Writes nothing; the tasks that copy its output show the diff.
seealso:
  - module: vllm_fleet.fleet.preflight
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Validate the profile and render the config of instance gpu0
  vllm_fleet.fleet.serve_config:
    schema: "{{ lookup('ansible.builtin.file', 'catalogue/vllm_serve_args.yml') | from_yaml }}"
    profile:
      name: qwen3.6-35b-a3b-nvfp4-sm120
      model: /models/qwen3.6-35b-a3b-nvfp4
      serve_args:
        gpu-memory-utilization: 0.95
        max-model-len: 262144
        enable-prefix-caching: true
        enforce-eager: false          # written as no-enforce-eager: true
        kv-cache-dtype: fp8
      env:
        VLLM_USE_DEEP_GEMM_E8M0: "0"
    role_args: {host: 0.0.0.0, port: 8000}
    role_env: {CUDA_VISIBLE_DEVICES: "0", CUDA_DEVICE_ORDER: PCI_BUS_ID}
    reserved_env:
      VLLM_API_KEY: set vllm_fleet_service_api_key instead
    header: Managed by Ansible
  register: serve

- name: Write it
  ansible.builtin.copy:
    content: "{{ serve.content }}"
    dest: /etc/vllm-fleet/gpu0.yaml
    mode: "0640"
"""

RETURN = r"""
profile:
  description: The applied profile as preflight reads it, flag names normalised and booleans kept as booleans.
  returned: success
  type: dict
  sample:
    name: qwen3.6-35b-a3b-nvfp4-sm120
    model: /models/qwen3.6-35b-a3b-nvfp4
    serve_args: {enable-prefix-caching: true, enforce-eager: false, kv-cache-dtype: fp8}
    env: {VLLM_USE_DEEP_GEMM_E8M0: "0"}
config:
  description: The C(vllm serve --config) mapping, as written (model first, C(no-) forms for false).
  returned: success
  type: dict
  sample: {model: /models/qwen3.6-35b-a3b-nvfp4, enable-prefix-caching: true, no-enforce-eager: true, port: 8000}
content:
  description: The config file's text.
  returned: success
  type: str
env:
  description: The environment, profile's then the caller's, as text.
  returned: success
  type: dict
  sample: {VLLM_USE_DEEP_GEMM_E8M0: "0", CUDA_VISIBLE_DEVICES: "0"}
env_content:
  description: The C(EnvironmentFile=) text, C(NAME="value") lines.
  returned: success
  type: str
errors:
  description: Every problem found, one readable line each.
  returned: failure
  type: list
  elements: str
  sample:
    - "profile.serve_args.enable-prefix-cache: unknown flag --enable-prefix-cache for vllm serve 0.25.1 (did you mean --enable-prefix-caching?)"
    - "profile.serve_args.gpu-memory-utilization: --gpu-memory-utilization 1.5 is out of range: it must be > 0 and <= 1"
"""

# Rendered on the controller by the action plugin of the same name (plugins/action/serve_config.py),
# which validates the task's arguments against this spec.
ARGUMENT_SPEC = dict(
    schema=dict(type="raw", required=True),
    profile=dict(type="dict", required=True),
    role_args=dict(type="dict", default={}),
    role_env=dict(type="dict", default={}),
    reserved_env=dict(type="dict", default={}),
    header=dict(type="str", default=""),
    models_dir=dict(type="str", default=""),
)
