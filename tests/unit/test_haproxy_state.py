"""HAProxy's admin-socket answers (module_utils/haproxy_state.py) as plain Python: the
answers below are HAProxy 2.6's own, captured with node01 drained while down and node02
in maintenance; the socket itself is real in the integration tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.haproxy_state import (
    HAProxyError,
    admin_state,
    merge,
    name_problem,
    parse_servers_state,
    parse_stat,
    read_backend,
    verdict,
)

ROOT = Path(__file__).resolve().parents[2]

SERVERS_STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 vllm 1 node01 127.0.0.1 0 8 1 1 0 8 2 0 6 0 0 0 - 19998 - 0 0 - - 0
3 vllm 2 node02 127.0.0.1 0 1 1 1 3 8 2 0 14 0 0 0 - 19997 - 0 0 - - 0
3 vllm 3 node03 127.0.0.1 2 0 1 1 3 8 2 0 14 0 0 0 - 19996 - 0 0 - - 0

"""

HEADER = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,"
          "weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,"
          "rate_lim,rate_max,check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,")
STAT = "\n".join([
    HEADER,
    "f,FRONTEND,,,0,0,9985,0,0,0,0,0,0,,,,,OPEN,,,,,,,,,1,2,0,,,,0,0,0,0,,,,0,0,0,0,0,",
    "vllm,node01,0,0,0,0,,0,0,0,,0,,0,0,0,0,DOWN,1,1,0,1,1,0,0,,1,3,1,,0,,2,0,,0,L4CON,,0,0,0,0,0,0,",
    "vllm,node02,0,0,0,0,,0,0,0,,0,,0,0,0,0,MAINT,1,1,0,1,1,3,3,,1,3,2,,0,,2,0,,0,,,,0,0,0,0,0,0,",
    "vllm,node03,0,0,2,5,,90,0,0,,0,,1,0,4,3,UP,1,1,0,1,1,3,3,,1,3,2,,0,,2,0,,0,,,,0,88,0,0,2,0,",
    "vllm,BACKEND,0,0,2,5,999,90,0,0,0,0,,1,0,4,3,UP,0,0,0,,1,3,3,,1,3,0,,0,,1,0,,0,,,,0,88,0,0,2,0,",
    "other,node01,0,0,7,7,,0,0,0,,0,,0,0,9,9,UP,1,1,0,1,1,0,0,,1,3,1,,0,,2,0,,0,,,,0,0,0,0,0,0,",
    "",
])


def test_admin_state_names_haproxy_bits():
    assert [admin_state(bits) for bits in (0, 0x01, 0x08, 0x10, 0x09, 0x20)] == \
           ["READY", "MAINT", "DRAIN", "DRAIN", "MAINT", "MAINT"]


def test_servers_state_gives_admin_and_operational_state():
    assert parse_servers_state(SERVERS_STATE, "vllm") == {
        "node01": {"admin": "DRAIN", "operational": "DOWN"},
        "node02": {"admin": "MAINT", "operational": "DOWN"},
        "node03": {"admin": "READY", "operational": "UP"},
    }


def test_an_unknown_backend_is_an_error_not_an_empty_backend():
    with pytest.raises(HAProxyError, match="no backend 'nosuch'"):
        parse_servers_state("Can't find backend.\n\n", "nosuch")


def test_stat_gives_the_backends_counters_only():
    stats = parse_stat(STAT, "vllm")
    assert set(stats) == {"node01", "node02", "node03", "BACKEND"}  # not the other backend's node01
    assert stats["node03"] == {"status": "UP", "scur": 2, "wretr": 4, "wredis": 3, "econ": 1, "eresp": 0,
                               "hrsp_5xx": 2, "stot": 90}
    assert stats["node02"]["status"] == "MAINT"


def test_garbage_is_refused():
    with pytest.raises(HAProxyError):
        parse_stat("Unknown command\n", "vllm")
    with pytest.raises(HAProxyError):
        parse_servers_state("Permission denied\n", "vllm")


def test_verdict_judges_drain_ready_idle_and_names_the_missing():
    servers = merge(parse_servers_state(SERVERS_STATE, "vllm"), parse_stat(STAT, "vllm"))
    assert verdict(servers, ["node01", "node02"], "drain") == ([], {})
    assert verdict(servers, ["node03"], "drain") == ([], {"node03": "admin READY"})
    assert verdict(servers, ["node03"], "ready") == ([], {})
    assert verdict(servers, ["node01"], "ready") == ([], {"node01": "admin DRAIN, operational DOWN"})
    assert verdict(servers, ["node03"], "idle") == ([], {"node03": "2 current sessions"})
    assert verdict(servers, ["node01"], "idle") == ([], {})
    assert verdict(servers, ["node1", "node03"], "present") == (["node1"], {})


@pytest.fixture
def admin_socket(tmp_path):
    """A UNIX socket that answers like HAProxy's admin socket and records every line sent."""
    path = str(tmp_path / "admin.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    received = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                line = conn.recv(65536).decode()
                received.append(line)
                conn.sendall((SERVERS_STATE if line.startswith("show servers state") else STAT).encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, received
    server.close()


@pytest.mark.parametrize("backend", [
    "vllm;disable server vllm/node02;disable frontend fe",  # the red team's injection
    "vllm\ndisable server vllm/node02", "vllm backend2", "vllm\x1b[2J", "", "v" * 101, None,
])
def test_a_backend_that_is_not_a_haproxy_name_is_refused_before_anything_is_sent(admin_socket, backend):
    path, received = admin_socket
    with pytest.raises(HAProxyError, match="is not a HAProxy name"):
        read_backend(path, backend, timeout=2)
    assert received == []


def test_a_haproxy_name_is_read_from_the_socket(admin_socket):  # negative control of the above
    path, received = admin_socket
    assert sorted(read_backend(path, "vllm", timeout=2)) == ["node01", "node02", "node03"]
    assert received == ["show servers state vllm\n", "show stat\n"]


def test_haproxy_names_follow_haproxys_own_rule():
    for name in ("vllm", "node01", "node01-gpu0", "be_v1.2:x", "v" * 100):
        assert name_problem("server", name) is None
    for name in ("node01;x", "node 01", "node01/x", "nöde", "v" * 101, 7):
        assert "server" in name_problem("server", name)


def test_the_module_refuses_a_server_name_before_it_opens_the_socket(admin_socket):
    """haproxy_servers (the rollout's read before every drain and enable, in --check too)."""
    path, received = admin_socket
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"}

    def run(args):
        proc = subprocess.run(
            [Path(sys.executable).parent / "ansible", "localhost", "-i", "localhost,", "-c", "local", "--check",
             "-e", f"ansible_python_interpreter={sys.executable}", "-m", "vllm_fleet.fleet.haproxy_servers",
             "-a", json.dumps(args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stdout + proc.stderr
        return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]

    refused = run({"socket": path, "backend": "vllm", "servers": ["node01;disable frontend fe"]})
    assert refused["failed"] and "server 'node01;disable frontend fe' is not a HAProxy name" in refused["msg"]
    assert "Nothing was sent to HAProxy" in refused["msg"] and received == []
    read = run({"socket": path, "backend": "vllm", "servers": ["node01"]})  # negative control
    assert not read.get("failed") and read["known"] == ["node01", "node02", "node03"]
    assert received == ["show servers state vllm\n", "show stat\n"]
