#!/usr/bin/python
"""haproxy_servers: read what HAProxy says of a backend's servers, from its admin socket."""

DOCUMENTATION = r"""
module: haproxy_servers
short_description: Read the state and counters of HAProxy servers from the admin socket
description:
  - Reads C(show servers state <backend>) and C(show stat) on HAProxy's admin socket and returns,
    per server of the backend, its admin state (C(READY), C(DRAIN), C(MAINT)), its operational
    state (C(UP), C(DOWN), C(STARTING), C(STOPPING)), the status C(show stat) shows, and its
    current sessions (C(scur)), retries (C(wretr)), redispatches (C(wredis)) and 5xx counters.
  - Judges the named O(servers) against O(expect) without failing, so that C(until) loops can wait
    on it. RV(missing) lists the names HAProxy does not know, RV(wrong) what it says of the others.
    It fails only when the socket cannot be read or the backend does not exist.
  - The read-back after a C(community.general.haproxy) change, which reports only what it sent.
version_added: 0.2.0
options:
  socket:
    description: HAProxy's admin socket (C(stats socket ... level admin)).
    type: path
    default: /run/haproxy/admin.sock
  backend:
    description:
      - The backend whose servers are read.
      - A HAProxy name (letters, digits, C(.), C(_), C(:), C(-)); anything else is refused before
        anything is sent to the socket, since the socket runs each C(;)-separated command.
    type: str
    required: true
  servers:
    description:
      - The server names to judge; empty judges none (every server is still returned).
      - HAProxy names, checked like O(backend).
    type: list
    elements: str
    default: []
  expect:
    description:
      - C(present) only that HAProxy knows each name; C(drain) admin state C(DRAIN) or C(MAINT);
        C(ready) admin state C(READY) and operationally C(UP); C(idle) no current sessions.
    type: str
    choices: [present, drain, ready, idle]
    default: present
  timeout:
    description: Seconds to wait for HAProxy's answer.
    type: int
    default: 10
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check that HAProxy drains node01
  vllm_fleet.fleet.haproxy_servers:
    socket: /run/haproxy/admin.sock
    backend: vllm
    servers: [node01]
    expect: drain
  register: lb
  until: lb.ok
  retries: 10
  delay: 1
"""

RETURN = r"""
ok:
  description: Whether every name in O(servers) exists and meets O(expect).
  type: bool
  returned: always
missing:
  description: The names in O(servers) that the backend has no server for.
  type: list
  elements: str
  returned: always
wrong:
  description: For each name that exists but does not meet O(expect), what HAProxy says of it.
  type: dict
  returned: always
  sample: {node01: "admin READY"}
known:
  description: The names of every server of the backend, sorted.
  type: list
  elements: str
  returned: always
servers:
  description: Every server of the backend, with its states and counters; the backend's own totals under C(BACKEND) are not included.
  type: dict
  returned: always
  sample:
    node01: {admin: DRAIN, operational: UP, status: DRAIN, scur: 0, wretr: 0, wredis: 0, econ: 0, eresp: 0, hrsp_5xx: 0, stot: 120}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.haproxy_state import (
    HAProxyError,
    name_problem,
    read_backend,
    verdict,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
            backend=dict(type="str", required=True),
            servers=dict(type="list", elements="str", default=[]),
            expect=dict(type="str", choices=["present", "drain", "ready", "idle"], default="present"),
            timeout=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    params = module.params
    problems = [p for p in [name_problem("backend", params["backend"])]
                + [name_problem("server", name) for name in params["servers"]] if p]
    if problems:
        module.fail_json(msg="%s. Nothing was sent to HAProxy." % "; ".join(problems))
    try:
        servers = read_backend(params["socket"], params["backend"], params["timeout"])
    except (OSError, HAProxyError) as exc:
        module.fail_json(msg="cannot read backend %s from HAProxy's admin socket %s: %s"
                         % (params["backend"], params["socket"], exc))
    missing, wrong = verdict(servers, params["servers"], params["expect"])
    module.exit_json(changed=False, ok=not missing and not wrong, missing=missing, wrong=wrong,
                     known=sorted(servers), servers=servers)


if __name__ == "__main__":
    main()
