# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: rollout_batches
short_description: The batches Ansible's serial makes of a play's hosts
version_added: "0.1.0"
description:
  - Splits the hosts, in order, into batches the way Ansible's C(serial) keyword does. Each
    entry of the plan is a node count or a percentage of all the hosts (at least 1), the last
    entry repeating until every host is in a batch.
  - The rollout compares the batch Ansible is running with the batch the plan gives, because
    C(serial) is templated before any host exists and so never sees inventory variables.
positional: _input
options:
  _input:
    description: The play's hosts, in order (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  plan:
    description: The batch plan (C(vllm_fleet_rollout_batches)), e.g. C([1, 2, '50%', '100%']).
    type: list
    required: true
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: The batches of five nodes
  ansible.builtin.debug:
    msg: "{{ ['n1', 'n2', 'n3', 'n4', 'n5'] | vllm_fleet.fleet.rollout_batches([1, 2, '50%']) }}"
  # -> [['n1'], ['n2', 'n3'], ['n4', 'n5']]
"""

RETURN = r"""
_value:
  description: The batches, each a list of hosts.
  type: list
  elements: list
"""


def _size(entry, total: int) -> int:
    text = str(entry)
    if text.endswith("%"):
        return int(int(text[:-1]) / 100.0 * total) or 1
    return int(text)


def rollout_batches(hosts, plan):
    hosts, batches = list(hosts), []
    sizes = [_size(entry, len(hosts)) for entry in plan] or [len(hosts)]
    start = 0
    while start < len(hosts):
        size = sizes[min(len(batches), len(sizes) - 1)]
        batches.append(hosts[start:start + size])
        start += size
    return batches


class FilterModule:
    def filters(self):
        return {"rollout_batches": rollout_batches}
