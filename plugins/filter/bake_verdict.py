# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: bake_verdict
short_description: Judge a node's bake in client traffic from HAProxy, systemd and vLLM
version_added: "0.3.0"
description:
  - The verdict of a node's bake (C(vllm_fleet.fleet.rollout_node)), the watch after its soak
    once it serves clients again. It fails on HAProxy 5xx answers, connection or response
    errors, retries or redispatches above their limits, a server not READY and UP, a vLLM unit
    that restarted or stopped (a new invocation, by systemd or by the watchdog), an
    instance that does not answer its metrics, or a KV cache fuller than the limit.
positional: _input
options:
  _input:
    description: HAProxy's servers of the backend before the bake (C(vllm_fleet.fleet.haproxy_servers)' C(servers)).
    type: dict
    required: true
  lb_after:
    description: The same at the end of the bake.
    type: dict
    required: true
  servers:
    description: The node's server names, the ones judged.
    type: list
    elements: str
    required: true
  units_before:
    description:
      - The output of C(systemctl show -p Id -p InvocationID -p NRestarts -p ActiveState) for the node's
        C(vllm@<instance>.service) units, before the bake.
    type: str
    required: true
  units_after:
    description: The same at the end of the bake.
    type: str
    required: true
  metrics:
    description: Per instance, C(vllm_fleet.fleet.vllm_metrics)' result at the end of the bake.
    type: dict
    required: true
  limits:
    description: C(max_5xx) and C(max_errors) (counts over the bake), C(max_kv_usage) (0-1).
    type: dict
    required: true
  seconds:
    description: How long the bake watched, for the messages.
    type: float
    default: 0
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: Judge the bake
  ansible.builtin.set_fact:
    bake: >-
      {{ lb_before.servers | vllm_fleet.fleet.bake_verdict(lb_after.servers, ['node01'], units_before.stdout, units_after.stdout,
         metrics, {'max_5xx': 0, 'max_errors': 0, 'max_kv_usage': 0.95}, 600) }}
"""

RETURN = r"""
_value:
  description: >-
    C(passed), C(reasons) (one sentence each), C(proved) (passed and clients reached the node),
    C(seconds), and the totals C(requests), C(hrsp_5xx), C(errors), C(restarts).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.bake import bake_verdict as _bake_verdict


def bake_verdict(lb_before, lb_after, servers, units_before, units_after, metrics, limits, seconds=0.0):
    try:
        return _bake_verdict(lb_before, lb_after, servers, units_before, units_after, metrics, limits, float(seconds))
    except (ValueError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError("bake_verdict: %s" % exc) from None


class FilterModule:
    def filters(self):
        return {"bake_verdict": bake_verdict}
