#!/usr/bin/python
"""rollout_lock: take, renew or release the lease that lets one rollout run at a time."""

DOCUMENTATION = r"""
module: rollout_lock
short_description: Take, renew or release the rollout lock, a lease file on one host
description:
  - Keeps two rollouts from running at once. The lease is a JSON file naming its holder (an id unique
    to the run), the controller host, the pid and user of the ansible-playbook process, when it was
    taken and when it expires.
  - O(state=present) takes the lease atomically (written aside, then hard-linked into place), or
    renews it when O(holder) already holds it. It fails, naming the holder, its controller, pid,
    start and expiry, when another run holds it.
  - A lease past its expiry, or whose process is provably gone (it names this host as controller and
    its pid no longer runs), is stale. A stale lease is broken only when O(break_holder) names its
    holder; a live one never is.
  - O(state=absent) removes the lease only if O(holder) holds it; another run's lease is left alone
    and the task fails.
  - In check mode nothing is written (the checks run), so a check run leaves no lease.
  - The lease is read without following a symbolic link, at most 4096 bytes, and parsed strictly; a
    path that names a link, a directory or a file that is not a lease fails the task, never showing
    what the file holds (the path may name any file, a secret one too).
  - Another run prints the lease's fields, so O(holder), O(controller), O(user) and O(break_holder)
    with a control character (an escape sequence, a newline) are refused, and a lease read with one
    is shown escaped.
version_added: 0.3.0
options:
  path:
    description: The lease file. Its directory is created if missing.
    type: path
    default: /var/lib/vllm-fleet/rollout.lock
  state:
    description: C(present) takes or renews the lease, C(absent) releases it.
    type: str
    choices: [present, absent]
    default: present
  holder:
    description:
      - The id of this run, unique per run; 1 to 128 letters, digits and the characters C(._:@+-),
        beginning with a letter or digit (it names a temporary file beside the lease).
    type: str
    required: true
  ttl:
    description: Seconds from now until the lease expires (each renewal restarts them).
    type: int
    default: 14400
  controller:
    description: The host that runs ansible-playbook, recorded in the lease.
    type: str
    default: ''
  pid:
    description: The pid of ansible-playbook on O(controller), recorded in the lease.
    type: int
    default: 0
  user:
    description: The user who runs the rollout, recorded in the lease.
    type: str
    default: ''
  break_holder:
    description: The holder id of a stale lease to break; empty breaks none.
    type: str
    default: ''
attributes:
  check_mode:
    support: full
    description: Reads and judges the lease; writes nothing.
  diff_mode:
    support: none
    description: No diff.
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the rollout lock
  vllm_fleet.fleet.rollout_lock:
    path: /var/lib/vllm-fleet/rollout.lock
    holder: "{{ run_id }}"
    ttl: 14400
    controller: "{{ controller }}"
    pid: "{{ controller_pid }}"
    user: "{{ controller_user }}"
  delegate_to: lb01
  run_once: true

- name: Release it
  vllm_fleet.fleet.rollout_lock:
    path: /var/lib/vllm-fleet/rollout.lock
    holder: "{{ run_id }}"
    state: absent
  delegate_to: lb01
  run_once: true
"""

RETURN = r"""
lease:
  description: The lease taken or renewed (O(state=present)) or released (O(state=absent)); empty when there was none to release.
  type: dict
  returned: always
  sample:
    holder: 3f1c2a90-6b7e-5d4c-9a8b-1c2d3e4f5a6b
    controller: ctl01
    pid: 41250
    user: deploy
    started: "2026-12-04T14:10:33+00:00"
    expires: "2026-12-04T18:10:33+00:00"
    ttl: 14400
broken:
  description: The stale lease this task broke (O(break_holder)); empty when none.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.rollout_lock import lock_task

# Also validated by the action plugin of the same name (plugins/action/rollout_lock.py), which runs
# the task in the controller's own process when the lock host is the controller.
ARGUMENT_SPEC = dict(
    path=dict(type="path", default="/var/lib/vllm-fleet/rollout.lock"),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    holder=dict(type="str", required=True),
    ttl=dict(type="int", default=14400),
    controller=dict(type="str", default=""),
    pid=dict(type="int", default=0),
    user=dict(type="str", default=""),
    break_holder=dict(type="str", default=""),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result = lock_task(module.params, check=module.check_mode)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
