#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: config_files
short_description: Write a node's configuration files and directories in one run
version_added: "0.3.0"
description:
  - Makes the node hold the directories in O(directories) and the files in O(files), and not
    the paths in O(absent), in one module run, where it would otherwise take one
    M(ansible.builtin.copy) or M(ansible.builtin.template) task per file, each two round trips
    to the node.
  - A file is written only when its bytes differ, to a temporary file in its own directory
    with its owner and mode set before the content, then renamed into place, so no reader
    sees half a file and a secret is never readable by others. Owner, group and mode are
    corrected when they differ.
  - Every entry is checked (mode, owner, group, source) before the first write, so bad input
    changes nothing.
  - O(files[].content) is never shown in the task's output, but the node's journal records a
    module's arguments unless the task has C(no_log); a task that writes a secret sets it.
options:
  directories:
    description: Directories to create (with missing parents) and give the owner, group and mode.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: The directory., type: path, required: true}
      owner: {description: Its owner (a user name)., type: str, required: true}
      group: {description: Its group (a group name)., type: str, required: true}
      mode: {description: "Its mode: four octal digits, quoted (V('0750')).", type: str, required: true}
  files:
    description: Files to write. Give exactly one of O(files[].content) and O(files[].src).
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: The file; its directory must exist or be in O(directories)., type: path, required: true}
      content: {description: What it holds (never logged)., type: str}
      src: {description: A file on the node to copy it from., type: path}
      if_src_missing:
        description:
          - What a missing O(files[].src) means. V(fail) stops before any change; V(remove) makes the
            file absent too (a copy of an optional file, such as an API key that is not always set);
            V(keep) leaves the file as it is (a copy that older records do not hold).
        type: str
        choices: [fail, remove, keep]
        default: fail
      owner: {description: Its owner (a user name)., type: str, required: true}
      group: {description: Its group (a group name)., type: str, required: true}
      mode: {description: "Its mode: four octal digits, quoted (V('0640')).", type: str, required: true}
  absent:
    description: Files (or links) that must not exist.
    type: list
    elements: path
    default: []
seealso:
  - module: ansible.builtin.copy
attributes:
  check_mode:
    support: full
    description: Reports the paths that would change and changes none.
  diff_mode:
    support: none
    description: The files may hold secrets (an API key); only their paths are reported.
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the service's configuration
  vllm_fleet.fleet.config_files:
    directories:
      - {path: /etc/vllm-fleet, owner: root, group: vllm, mode: "0750"}
    files:
      - {path: /etc/vllm-fleet/gpu0.yaml, content: "model: /models/qwen\n", owner: root, group: vllm, mode: "0640"}
      - {path: /etc/vllm-fleet/known-good/gpu0.yaml, src: /etc/vllm-fleet/gpu0.yaml, owner: root, group: vllm, mode: "0640"}
    absent:
      - /etc/vllm-fleet/gpu1.yaml
"""

RETURN = r"""
changed_paths:
  description: The paths created, rewritten, given new attributes or removed (in check mode, that would be).
  type: list
  elements: str
  returned: always
  sample: [/etc/vllm-fleet/gpu0.yaml]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.config_files import ConfigFilesError, apply

_ATTRS = dict(owner=dict(type="str", required=True), group=dict(type="str", required=True),
              mode=dict(type="str", required=True))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[],
                             options=dict(path=dict(type="path", required=True), **_ATTRS)),
            # The journal's "Invoked with" record does not censor a no_log suboption inside a
            # list of dicts: a task that writes a secret sets no_log itself (vllm_service does).
            files=dict(type="list", elements="dict", default=[],
                       options=dict(path=dict(type="path", required=True), content=dict(type="str", no_log=True),
                                    src=dict(type="path"),
                                    if_src_missing=dict(type="str", choices=["fail", "remove", "keep"], default="fail"),
                                    **_ATTRS),
                       mutually_exclusive=[("content", "src")], required_one_of=[("content", "src")]),
            absent=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    try:
        changed = apply(module.params["directories"], module.params["files"], module.params["absent"],
                        check=module.check_mode)
    except ConfigFilesError as exc:
        module.fail_json(msg="%s. Nothing was changed on the node." % exc, changed_paths=[])
    except OSError as exc:
        module.fail_json(msg="cannot write the configuration: %s (%s). Check the disk and the path's "
                             "directory on the node, then run again." % (exc.strerror, exc.filename),
                         changed_paths=[])
    module.exit_json(changed=bool(changed), changed_paths=changed)


if __name__ == "__main__":
    main()
