#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: preflight
short_description: Judge a planned vLLM rollout against the known-issues catalogue
version_added: "0.1.0"
description:
  - Evaluates the known-issues catalogue (C(catalogue/known_issues.yml)) against the node's
    GPU facts and two serving plans, the config running now (O(current)) and the one about
    to be rolled out (O(planned)).
  - A plan is C(versions) (vllm, torch, cudnn), C(serve_args) (long vLLM flag names) and
    C(env) (the serving environment); the CUDA driver and NVIDIA driver versions come from
    the GPU facts. See docs/CONTRACTS.md.
  - Each matching entry is a finding. Unaccepted blockers of the planned config block the
    rollout; warnings are reported. Findings of the current config never block, they are
    why a rollout is needed.
  - A blocker can be accepted explicitly, with a reason, through O(accept); it is then
    reported as accepted and the verdict is C(warn).
  - Only reads its arguments; it never changes the node.
  - Runs on the controller (an action plugin); nothing is sent to the node, and the task needs no
    C(delegate_to).
options:
  catalogue:
    description:
      - The parsed catalogue document, a mapping with C(schema_version) and C(known_issues);
        read C(catalogue/known_issues.yml) with the C(ansible.builtin.file) lookup and the
        C(from_yaml) filter (see the examples).
      - A catalogue that does not follow the schema fails the task with a message naming the
        entry (index and id) and the field.
    type: raw
    required: true
  gpu:
    description:
      - The C(vllm_fleet_gpu) facts of the node, from M(vllm_fleet.fleet.gpu_facts).
      - Facts with C(available=false) fail the task with their reason.
    type: dict
    required: true
  current:
    description:
      - The plan of the config running on the node now, or V(null) for a node that serves
        nothing yet.
    type: dict
  planned:
    description:
      - The plan of the config to roll out.
    type: dict
    required: true
  accept:
    description:
      - Known issues accepted for this rollout, each with the reason it is acceptable here.
      - An id that is not in the catalogue, or an empty reason, fails the task.
    type: list
    elements: dict
    default: []
    suboptions:
      id:
        description: The catalogue id of the accepted issue.
        type: str
        required: true
      reason:
        description: Why the risk is acceptable here; recorded in the report.
        type: str
        required: true
  fail_on_blocker:
    description:
      - Fail the task when the verdict is C(block), with each blocker, its evidence and its
        fix in the message.
      - When V(false), the task returns the report with C(verdict=block) and does not fail.
    type: bool
    default: true
requirements:
  - packaging (PEP 440 versions) on the controller (ansible-core requires it)
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Judge the planned release before touching the node
  vllm_fleet.fleet.preflight:
    catalogue: "{{ lookup('ansible.builtin.file', 'catalogue/known_issues.yml') | from_yaml }}"
    gpu: "{{ vllm_fleet_gpu }}"
    current:
      versions: {vllm: "0.25.1", torch: "2.11.0", cudnn: "9.19.0"}
      serve_args: {kv-cache-dtype: fp8}
      env: {}
    planned:
      versions: {vllm: "0.25.1", torch: "2.11.0", cudnn: "9.24.0.43"}
      serve_args: {kv-cache-dtype: fp8, enforce-eager: false}
      env: {VLLM_USE_DEEP_GEMM_E8M0: "0"}
    accept: "{{ vllm_fleet_accepted_risks | default([]) }}"
  register: preflight

- name: Show the verdict
  ansible.builtin.debug:
    var: preflight.preflight.summary

- name: Report without failing (e.g. a fleet-wide audit)
  vllm_fleet.fleet.preflight:
    catalogue: "{{ lookup('ansible.builtin.file', 'catalogue/known_issues.yml') | from_yaml }}"
    gpu: "{{ vllm_fleet_gpu }}"
    planned: "{{ vllm_fleet_plan }}"
    fail_on_blocker: false
"""

RETURN = r"""
preflight:
  description: The report. Also returned when the task fails because the rollout is blocked.
  returned: success, and failure by a blocker
  type: dict
  contains:
    verdict:
      description:
        - V(block) (an unaccepted blocker in the planned config), V(warn) (warnings or an
          accepted blocker) or V(pass).
      type: str
      sample: pass
    current:
      description: Findings of the current config; they never block.
      type: list
      elements: dict
    planned:
      description:
        - Findings of the planned config, each with C(id), C(title), C(severity), C(scope),
          C(devices) (matching GPU indices; every GPU for a node-wide issue), C(matched)
          (readable reasons), C(symptom),
          C(evidence), C(fix), C(accepted) and C(accepted_reason).
      type: list
      elements: dict
      sample:
        - id: cudnn-sm12x-fusion-matmul-oob
          title: cuDNN < 9.23.1 fusion-engine matmul writes out of bounds on compute capability 12.0/12.1
          severity: blocker
          scope: planned
          devices: [0]
          matched: ["cudnn 9.19.0.56 matches <9.23.1", "compute capability 12.0 (device 0)"]
          symptom: "The engine dies with 'CUDA error: an illegal memory access was encountered' ..."
          evidence: ["GPU core dump of the crashing node ..."]
          fix: "Install nvidia-cudnn-cu13>=9.23.1 ..."
          accepted: false
          accepted_reason: null
    blockers:
      description: Planned blockers that are not accepted.
      type: list
      elements: dict
    accepted:
      description: Planned findings accepted through O(accept), with their reason.
      type: list
      elements: dict
    warnings:
      description: Planned warnings that are not accepted.
      type: list
      elements: dict
    message:
      description: Why the plan is blocked, each blocker with its evidence and fix, and how to accept it.
      returned: when RV(preflight.verdict) is V(block)
      type: str
    summary:
      description: The verdict and every finding as readable lines.
      type: list
      elements: str
      sample:
        - "verdict: pass (0 blocker(s), 0 warning(s), 0 accepted; 10 known issues checked)"
        - "current blocker cudnn-sm12x-fusion-matmul-oob: ... [device 0] -- fixed by the planned config"
"""

# Judged on the controller by the action plugin of the same name (plugins/action/preflight.py),
# which validates the task's arguments against this spec.
ARGUMENT_SPEC = dict(
    catalogue=dict(type="raw", required=True),
    gpu=dict(type="dict", required=True),
    current=dict(type="dict"),
    planned=dict(type="dict", required=True),
    accept=dict(
        type="list",
        elements="dict",
        default=[],
        options=dict(id=dict(type="str", required=True), reason=dict(type="str", required=True)),
    ),
    fail_on_blocker=dict(type="bool", default=True),
)
