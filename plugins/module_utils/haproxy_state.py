"""What HAProxy itself says about a backend's servers, from its admin socket: the parsing of
`show servers state <backend>` (admin and operational state) and `show stat` (per-server
current sessions, retries, redispatches, status), as plain Python so it can be tested
without a socket.

The state numbers are HAProxy's own (include/haproxy/server-t.h, stable since 1.8):
srv_op_state 0 stopped, 1 starting, 2 running, 3 stopping; srv_admin_state a bit field.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import csv
import re
import socket

OPERATIONAL = {0: "DOWN", 1: "STARTING", 2: "UP", 3: "STOPPING"}
# SRV_ADMF_*: forced, inherited, config and resolver maintenance, forced and inherited drain.
ADMIN_MAINT = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
ADMIN_DRAIN = 0x08 | 0x10
COUNTERS = ("scur", "wretr", "wredis", "econ", "eresp", "hrsp_5xx", "stot")


class HAProxyError(Exception):
    pass


# What HAProxy itself allows in a proxy or server name (src/tools.c, invalid_char: letters,
# digits, '.', '_', ':', '-'). The admin socket runs each ';'-separated command of a line, so
# a name with a ';', a space or a newline would be further commands: refused before sending.
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}\Z")


def name_problem(kind, value):
    """Why value cannot be a HAProxy backend or server name (kind says which), else None."""
    if isinstance(value, str) and NAME.match(value):
        return None
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return ("%s %s is not a HAProxy name: use 1 to 100 letters, digits, '.', '_', ':' or '-' "
            "(HAProxy's own rule; anything else would reach its admin socket as more commands)" % (kind, shown))


def admin_state(bits):
    """MAINT, DRAIN or READY, as HAProxy's `set server ... state` names them."""
    if bits & ADMIN_MAINT:
        return "MAINT"
    if bits & ADMIN_DRAIN:
        return "DRAIN"
    return "READY"


def parse_servers_state(text, backend):
    """`show servers state <backend>` -> {server: {'admin': ..., 'operational': ...}}."""
    if "Can't find backend" in text:
        raise HAProxyError("HAProxy has no backend %r" % backend)
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line for line in lines if line.startswith("# ")), None)
    if header is None:
        raise HAProxyError("not an answer to 'show servers state': %r" % text[:200])
    fields = header[2:].split()
    servers = {}
    for line in lines:
        if line.startswith("#") or len(line.split()) < len(fields) - 5:  # the version line
            continue
        row = dict(zip(fields, line.split()))
        if row.get("be_name") != backend:
            continue
        servers[row["srv_name"]] = {
            "admin": admin_state(int(row["srv_admin_state"])),
            "operational": OPERATIONAL.get(int(row["srv_op_state"]), row["srv_op_state"]),
        }
    return servers


def parse_stat(text, backend):
    """`show stat` (CSV) -> {server: {'status': ..., counters...}} for the backend's servers,
    plus the backend's own row under 'BACKEND'."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# pxname,"):
        raise HAProxyError("not an answer to 'show stat': %r" % text[:200])
    reader = csv.DictReader([lines[0][2:]] + [line for line in lines[1:] if line.strip()])
    stats = {}
    for row in reader:
        if row["pxname"] != backend or row["svname"] == "FRONTEND":
            continue
        entry = {"status": row["status"]}
        for name in COUNTERS:
            entry[name] = int(row.get(name) or 0)
        stats[row["svname"]] = entry
    return stats


def merge(states, stats):
    """One record per server: admin, operational, status and the counters."""
    return dict((name, dict(state, **stats.get(name, {}))) for name, state in states.items())


def ask(path, command, timeout=10):
    """One command on the admin socket at path; its whole answer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        sock.close()
    return b"".join(chunks).decode()


def read_backend(path, backend, timeout=10):
    """Every server of backend, as merge() gives them, read from the socket at path."""
    problem = name_problem("backend", backend)
    if problem:
        raise HAProxyError(problem)
    states = parse_servers_state(ask(path, "show servers state %s" % backend, timeout), backend)
    return merge(states, parse_stat(ask(path, "show stat", timeout), backend))


def verdict(servers, names, expect):
    """What is wrong with names in servers (read_backend's answer) against expect: None
    (only that they exist), 'drain' (admin DRAIN or MAINT), 'ready' (admin READY and
    operationally UP) or 'idle' (no current sessions). Returns (missing, wrong) where wrong
    maps a name to what HAProxy says of it."""
    missing = [name for name in names if name not in servers]
    wrong = {}
    for name in names:
        server = servers.get(name)
        if server is None:
            continue
        if expect == "drain" and server["admin"] not in ("DRAIN", "MAINT"):
            wrong[name] = "admin %s" % server["admin"]
        elif expect == "ready" and (server["admin"], server["operational"]) != ("READY", "UP"):
            wrong[name] = "admin %s, operational %s" % (server["admin"], server["operational"])
        elif expect == "idle" and server.get("scur", 0) != 0:
            wrong[name] = "%d current sessions" % server["scur"]
    return missing, wrong
