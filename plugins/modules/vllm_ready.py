#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: vllm_ready
short_description: Wait on the node until its vLLM instances serve
version_added: "0.1.0"
description:
  - Polls on the node itself, in one module run, until every instance serves after a (re)start, all
    within O(timeout) seconds, every O(delay) seconds.
  - 'systemd: C(systemctl show) of O(units) until every unit is C(ActiveState=active) with no job pending;
    a unit that reports C(ActiveState=failed) (systemd stopped restarting it: its start limit) ends the wait
    at once.'
  - Then per instance C(/health) 200, C(/v1/models) listing a model (C(/health) is green before a model
    serves), and one completion of that model that returns text.
  - On failure the message names the stage, the last answer, the units' states and the last 40 lines of
    each instance's journal.
options:
  instances:
    description: The instances, each with its C(name) (the unit C(vllm@<name>.service)) and C(port).
    type: list
    elements: dict
    required: true
  units:
    description: The units to wait for, without C(.service).
    type: list
    elements: str
    required: true
  host:
    description: The address the probes go to (not through a proxy).
    type: str
    default: 127.0.0.1
  api_keys:
    description:
      - Keys the instances may require, the current one first. With more than one (a rotation's window), the
        probes use the first one that the first instance's C(/v1/models) accepts. Empty, no key is sent.
      - Never returned nor logged; RV(key_index) says which one was taken.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds the whole wait may take.
    type: int
    required: true
  delay:
    description: Seconds between polls.
    type: float
    default: 5
  request_timeout:
    description: Seconds one HTTP request (or C(systemctl show)) may take.
    type: float
    default: 120
  prompt:
    description: Prompt of the completion.
    type: str
    required: true
  max_tokens:
    description: C(max_tokens) of the completion (at least 1, it must return text).
    type: int
    default: 8
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait until every instance serves
  vllm_fleet.fleet.vllm_ready:
    instances: [{name: gpu0, port: 8000}, {name: gpu1, port: 8001}]
    units: [vllm@gpu0, vllm@gpu1]
    api_keys: "{{ [vllm_api_key] }}"
    timeout: 900
    prompt: The fleet rolls out one node at a time
  register: ready
"""

RETURN = r"""
instances:
  description: Per instance, what its completion answered.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The instance.
      type: str
    port:
      description: Its port.
      type: int
    model:
      description: The model the completion names.
      type: str
    completion_tokens:
      description: C(usage.completion_tokens) of the completion (null when absent).
      type: int
  sample: [{name: gpu0, port: 8000, model: /models/qwen3.6-35b-a3b-nvfp4, completion_tokens: 8}]
systemd:
  description: The non-empty lines of the last C(systemctl show).
  returned: always
  type: list
  elements: str
  sample: [Id=vllm@gpu0.service, ActiveState=active, SubState=running, Job=, NRestarts=0]
key_index:
  description: The index in O(api_keys) of the key the instances take (null without keys).
  returned: success
  type: int
  sample: 0
polls:
  description: The C(systemctl show) runs and HTTP requests made.
  returned: success
  type: int
  sample: 9
stage:
  description: Where the wait stopped.
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.readiness import NotReady, wait_ready

ARGUMENT_SPEC = dict(
    instances=dict(type="list", elements="dict", required=True),
    units=dict(type="list", elements="str", required=True),
    host=dict(type="str", default="127.0.0.1"),
    api_keys=dict(type="list", elements="str", default=[], no_log=True),
    timeout=dict(type="int", required=True),
    delay=dict(type="float", default=5),
    request_timeout=dict(type="float", default=120),
    prompt=dict(type="str", required=True),
    max_tokens=dict(type="int", default=8, no_log=False),  # a count, not a secret
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    bad = [item for item in params["instances"] if not isinstance(item.get("name"), str) or "port" not in item]
    if bad or not params["instances"]:
        module.fail_json(msg="instances: each needs a name and a port, and there must be at least one")
    instances = [{"name": item["name"], "port": int(item["port"])} for item in params["instances"]]
    try:
        result = wait_ready(instances, params["units"], params["host"], params["api_keys"], params["timeout"],
                            params["delay"], params["request_timeout"], params["prompt"], params["max_tokens"])
    except NotReady as exc:
        module.fail_json(msg=exc.message, stage=exc.stage, systemd=exc.systemd)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
