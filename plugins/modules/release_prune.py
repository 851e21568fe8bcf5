#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: release_prune
short_description: Remove old vLLM releases from a node, never the serving or known-good one
version_added: "0.1.0"
description:
  - Looks at the releases under C(<root>/releases/) (one venv each, see docs/CONTRACTS.md)
    and removes the old ones.
  - A release is a directory holding C(vllm-fleet-release.json), the manifest the
    vllm_runtime role writes last. Other entries are reported in RV(prune.ignored) and
    left alone, since they were not made by this collection.
  - Never removes the release that a link in O(links) points at (by default C(current)
    and C(known-good), which the service role owns), nor a release named in O(protect).
  - Of the others, keeps the newest (by the time their manifest was written) so that
    O(keep) releases remain in all; when more than O(keep) are protected, only those remain.
  - Also removes C(.staging-*) and C(.pruning-*) directories, the leftovers of interrupted
    builds and prunes. Do not run it while the vllm_runtime role builds on the same node.
  - A release is renamed to C(.pruning-<id>) before it is deleted, so a prune that is cut
    short never leaves a half-deleted directory that looks like a release.
options:
  root:
    description:
      - The fleet root on the node (C(vllm_fleet_root)), holding C(releases/) and the links.
      - A root without C(releases/) has nothing to prune; that is not an error.
    type: path
    required: true
  keep:
    description:
      - How many releases remain, counting the protected ones first.
      - V(0) keeps only the protected releases.
    type: int
    default: 3
  protect:
    description:
      - Release ids never removed, for example the release just installed.
    type: list
    elements: str
    default: []
  links:
    description:
      - Names of links under O(root) whose target release is never removed.
    type: list
    elements: str
    default: [current, known-good]
seealso:
  - module: vllm_fleet.fleet.cudnn_facts
attributes:
  check_mode:
    support: full
    description: Reports what it would remove and removes nothing.
  diff_mode:
    support: none
    description: The result lists what was kept and removed, and why.
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Keep three releases, never the one just installed
  vllm_fleet.fleet.release_prune:
    root: /opt/vllm-fleet
    keep: 3
    protect:
      - "{{ vllm_fleet_release | vllm_fleet.fleet.release_id }}"
  register: pruned

- name: What would go, without removing anything
  vllm_fleet.fleet.release_prune:
    root: /opt/vllm-fleet
    keep: 1
  check_mode: true
"""

RETURN = r"""
prune:
  description: What was found, kept and removed, and why.
  returned: always
  type: dict
  contains:
    releases_dir:
      description: The directory that was pruned.
      type: str
      sample: /opt/vllm-fleet/releases
    kept:
      description: The releases that remain, newest first, each with why it stays.
      type: list
      elements: dict
      sample:
        - name: vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43
          reasons: [target of current, protected by the caller (the release just installed)]
        - name: vllm-0.25.1_nvidia-cudnn-cu13-9.19.0.56
          reasons: [target of known-good]
    removed:
      description: The releases removed (in check mode, that would be removed).
      type: list
      elements: str
      sample: [vllm-0.24.0_nvidia-cudnn-cu13-9.19.0.56]
    removed_leftovers:
      description: The C(.staging-*) and C(.pruning-*) directories removed.
      type: list
      elements: str
      sample: [.staging-vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43]
    protected:
      description: Each protected release id with the reasons it is protected.
      type: dict
      sample:
        vllm-0.25.1_nvidia-cudnn-cu13-9.19.0.56: [target of known-good]
    links:
      description:
        - Each link of O(links) - C(path), C(target) (resolved), C(release) (its id, or
          V(null)) and C(state) (V(absent), V(release), V(broken) or V(outside)).
      type: dict
      sample:
        current:
          path: /opt/vllm-fleet/current
          target: /opt/vllm-fleet/releases/vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43
          release: vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43
          state: release
    ignored:
      description: Entries of C(releases/) that are not releases (no manifest, a link, a file); left alone.
      type: list
      elements: str
      sample: [notes.txt]
    message:
      description: One readable sentence.
      type: str
      sample: "removed 1 release(s) (vllm-0.24.0_nvidia-cudnn-cu13-9.19.0.56); 3 kept."
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import ReleaseError, prune_releases

ARGUMENT_SPEC = dict(
    root=dict(type="path", required=True),
    keep=dict(type="int", default=3),
    protect=dict(type="list", elements="str", default=[]),
    links=dict(type="list", elements="str", default=["current", "known-good"]),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        result = prune_releases(
            params["root"], params["keep"], protect=params["protect"], links=params["links"],
            check_mode=module.check_mode,
        )
    except ReleaseError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"pruning releases under {params['root']} failed: {exc}")
    changed = result.pop("changed")
    module.exit_json(changed=changed, prune=result, msg=result["message"])


if __name__ == "__main__":
    main()
