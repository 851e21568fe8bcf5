#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: controller_file
short_description: Write a JSON document on the controller (reports, verdicts), its directory made
version_added: "0.1.0"
description:
  - Writes O(data) as JSON (sorted keys, as C(to_nice_json) writes it) to O(path) on the
    controller, making its directories (0755) and replacing the file atomically, so a reader never
    sees half a report.
  - With O(append), O(data) is a list appended to the list the file already holds (a file that
    does not exist yet counts as an empty list).
  - Runs in the controller's own process (an action plugin), so no module is started, on the
    controller or on any node. A rollout writes a report per node turn; as a module (C(file) and
    C(copy) delegated to localhost) each cost two or three Python processes.
  - Supports check mode (says whether it would change the file). A report that must be
    written in check mode too sets the task keyword C(check_mode) to false.
options:
  path:
    description: The file on the controller.
    type: path
    required: true
  data:
    description: What to write, any JSON-serialisable value.
    type: raw
    required: true
  append:
    description: O(data) is a list appended to the list already in O(path).
    type: bool
    default: false
  indent:
    description: Spaces per level of the JSON.
    type: int
    default: 4
  mode:
    description: The file's permissions, octal text.
    type: str
    default: "0644"
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the node's rollout report
  vllm_fleet.fleet.controller_file:
    path: "{{ vllm_fleet_report_dir }}/rollout/{{ inventory_hostname }}.json"
    data: {host: "{{ inventory_hostname }}", status: upgraded}

- name: Record the failed notifications, one read-and-write at a time
  vllm_fleet.fleet.controller_file:
    path: "{{ vllm_fleet_report_dir }}/notifications.json"
    data: "{{ failed }}"
    append: true
  throttle: 1
"""

RETURN = r"""
path:
  description: The file written.
  returned: always
  type: str
"""

# Written on the controller by the action plugin of the same name (plugins/action/controller_file.py),
# which validates the task's arguments against this spec.
ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    data=dict(type="raw", required=True),
    append=dict(type="bool", default=False),
    indent=dict(type="int", default=4),
    mode=dict(type="str", default="0644"),
)
