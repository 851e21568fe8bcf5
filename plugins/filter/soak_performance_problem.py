# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
name: soak_performance_problem
short_description: What is wrong with a soak's performance baseline and tolerances, if anything
version_added: "0.1.0"
description:
  - Checks a baseline (metric name to expected figure) and its tolerances the way the
    M(vllm_fleet.fleet.soak) module does, so a role can refuse them before anything changes,
    with a message that names its own variables.
  - "Refused: a mapping of the wrong type, an unknown metric, a figure that is not a number
    above 0, a C(kv_cache_peak) above 1, a tolerance outside 0 < t < 0.5 (C(5) meant as 5% would
    pass everything), a tolerance without its baseline figure."
  - The empty string when both are fine.
positional: _input, tolerances
options:
  _input:
    description: The baseline, a mapping of metric name to figure (C(total_token_throughput), C(kv_cache_peak), ...).
    type: raw
    required: true
  tolerances:
    description: Per-metric tolerances (fractions; C(kv_cache_peak) in fraction points).
    type: raw
    required: true
  baseline_name:
    description: The baseline's variable, for the message.
    type: str
    default: baseline
  tolerances_name:
    description: The tolerances' variable, for the message.
    type: str
    default: tolerances
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: Check the performance gate's figures
  ansible.builtin.assert:
    that: _problem == ''
    fail_msg: "{{ _problem }}"
  vars:
    _problem: >-
      {{ vllm_fleet_soak_baseline | vllm_fleet.fleet.soak_performance_problem(vllm_fleet_soak_tolerances,
         'vllm_fleet_soak_baseline', 'vllm_fleet_soak_tolerances') }}
"""

RETURN = r"""
_value:
  description: The problem in one sentence, naming the variable, the value and what is allowed; empty when none.
  type: str
  sample: >-
    vllm_fleet_soak_tolerances.total_token_throughput is 5: a tolerance is a fraction,
    0 < tolerance < 0.5 (0.05 for 5%)
"""

# The module_utils are imported when the filter runs: to find one filter, Ansible imports (and
# compiles, collections have no .pyc) every filter file of the collection in each worker.


def soak_performance_problem(baseline, tolerances, baseline_name="baseline", tolerances_name="tolerances"):
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import (
        SoakConfigError,
        validate_performance_spec,
    )

    try:
        validate_performance_spec(baseline, tolerances, baseline_name=baseline_name, tolerances_name=tolerances_name)
    except SoakConfigError as exc:
        return str(exc)
    return ""


class FilterModule:
    def filters(self):
        return {"soak_performance_problem": soak_performance_problem}
