"""The fleet_lb role without a fleet: the real role (playbooks/lb.yml, local connection)
writes HAProxy's config for a composed inventory; Debian's haproxy checks it. Its servers
are named exactly as the rollout names them (rollout_node's _from_state.yml, evaluated here), a
second run changes nothing, check mode writes nothing, bad settings are refused naming the
variable, and a config haproxy -c rejects never replaces the old one. The state dump
(files/haproxy-save-state) is run against a stand-in admin socket."""
from __future__ import annotations

import grp
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule

ROOT = Path(__file__).resolve().parents[2]
SAVE_STATE = ROOT / "roles" / "fleet_lb" / "files" / "haproxy-save-state"
# A canary with the default instance, a two-GPU node, a node HAProxy reaches on another
# address than Ansible, and the LB host itself (group lb), which is not a server.
INVENTORY = {"all": {
    "hosts": {
        "node01": {"ansible_host": "10.0.0.1"},
        "node02": {"ansible_host": "10.0.0.2", "vllm_fleet_instances": [
            {"name": "gpu0", "gpu": 0, "port": 8000}, {"name": "gpu1", "gpu": 1, "port": 8001}]},
        "node03": {"ansible_host": "10.0.0.3", "vllm_fleet_lb_server_address": "192.168.7.3"},
        "lb01": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
    },
    "children": {"canary": {"hosts": {"node01": None}}, "fleet": {"hosts": {"node02": None, "node03": None}},
                 "lb": {"hosts": {"lb01": None}}},
}}


def haproxy() -> str:
    path = shutil.which("haproxy")
    if path is None:
        pytest.fail("haproxy is not installed: run scripts/setup-host.sh as root (Debian's haproxy)", pytrace=False)
    return path


def apply(tmp_path: Path, out: Path, *args: str, **extra) -> subprocess.CompletedProcess:
    (tmp_path / "inventory.json").write_text(json.dumps(INVENTORY))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_NOCOLOR": "1"}
    group = grp.getgrgid(os.getgid()).gr_name
    variables = {"vllm_fleet_rollout_lb_host": "lb01", "vllm_fleet_lb_config": str(out / "haproxy.cfg"),
                 "vllm_fleet_lb_haproxy": haproxy(), "vllm_fleet_lb_socket": str(out / "admin.sock"),
                 "vllm_fleet_lb_state_file": str(out / "server-state"), "vllm_fleet_lb_group": group,
                 "vllm_fleet_lb_user": "", "vllm_fleet_lb_manage_service": False, **extra}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.json"),
                           "playbooks/lb.yml", "-e", json.dumps(variables), *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=180, check=False)


def changed(proc: subprocess.CompletedProcess) -> int:
    recap = [line for line in proc.stdout.splitlines() if line.startswith("lb01 ")]
    assert recap, proc.stdout[-3000:]
    return int(recap[-1].split("changed=")[1].split()[0])


def servers(config: str) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in config.splitlines() if line.strip().startswith("server ")}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lb")
    out = tmp / "haproxy"
    out.mkdir()
    proc = apply(tmp, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return out


def rollout_server_names(host: str, instances: list[dict]) -> list[str]:
    """rollout_node's own expression for a node's server names (_from_state.yml), evaluated."""
    tasks = yaml.safe_load((ROOT / "roles" / "rollout_node" / "tasks" / "_from_state.yml").read_text())
    expression = next(t["ansible.builtin.set_fact"]["_vllm_fleet_rollout_servers"] for t in tasks
                      if "_vllm_fleet_rollout_servers" in t.get("ansible.builtin.set_fact", {}))
    env = jinja2.Environment()
    env.filters.update(FilterModule().filters())
    return yaml.safe_load(env.from_string(expression).render(inventory_hostname=host, vllm_fleet_instances=instances))


def test_one_server_per_instance_named_as_the_rollout_names_them(rendered):
    got = servers((rendered / "haproxy.cfg").read_text())
    default = yaml.safe_load((ROOT / "roles" / "fleet_defaults" / "defaults" / "main.yml").read_text())[
        "vllm_fleet_instances"]
    expected = {}
    for host in ("node01", "node02", "node03"):
        instances = INVENTORY["all"]["hosts"][host].get("vllm_fleet_instances", default)
        expected.update(zip(rollout_server_names(host, instances), (i["port"] for i in instances)))
    assert set(got) == set(expected) == {"node01", "node02-gpu0", "node02-gpu1", "node03"}
    assert got == {"node01": "10.0.0.1:8000", "node02-gpu0": "10.0.0.2:8000", "node02-gpu1": "10.0.0.2:8001",
                   "node03": "192.168.7.3:8000"}  # the server address wins over ansible_host; lb01 is no server


def test_the_config_passes_haproxy_c_and_keeps_drains_over_a_reload(rendered):
    text = (rendered / "haproxy.cfg").read_text()
    check = subprocess.run([haproxy(), "-c", "-f", str(rendered / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = [line.strip() for line in text.splitlines()]
    group = grp.getgrgid(os.getgid()).gr_name
    assert f"stats socket {rendered / 'admin.sock'} mode 660 group {group} level admin expose-fd listeners" in lines  # never the world's
    assert f"server-state-file {rendered / 'server-state'}" in lines
    assert "load-server-state-from-file global" in lines
    assert {"option httpchk GET /health", "http-check expect status 200", "retries 3", "option redispatch 1",
            "retry-on conn-failure empty-response response-timeout 502 503"} <= set(lines)
    assert "backend vllm" in lines and "bind :8000" in lines
    assert oct((rendered / "haproxy.cfg").stat().st_mode & 0o777) == "0o640"


def test_a_second_run_changes_nothing_and_check_mode_writes_nothing(rendered, tmp_path):
    again = apply(tmp_path, rendered)
    assert again.returncode == 0 and changed(again) == 0, again.stdout[-3000:]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    dry = apply(tmp_path, fresh, "--check")
    assert dry.returncode == 0 and changed(dry) == 1, dry.stdout[-3000:]
    assert list(fresh.iterdir()) == []


@pytest.mark.parametrize("variable, value, words", [
    ("vllm_fleet_lb_bind", "127.0.0.1:80\n    bind 0.0.0.0:81", "vllm_fleet_lb_bind"),
    ("vllm_fleet_lb_retry_on", "conn-failure sometimes", "vllm_fleet_lb_retry_on"),
    ("vllm_fleet_lb_group", "hap roxy", "vllm_fleet_lb_group"),
    ("vllm_fleet_lb_timeout_server", "ten minutes", "vllm_fleet_lb_timeout_server"),
    ("vllm_fleet_lb_state_file", "server-state", "vllm_fleet_lb_state_file"),
    ("vllm_fleet_lb_nodes", ["node01", "node09"], "not in the inventory: node09"),
    ("vllm_fleet_lb_haproxy", "/nonexistent/haproxy", "is not an executable"),
])
def test_bad_settings_are_refused_naming_the_variable_before_anything_is_written(tmp_path, variable, value, words):
    out = tmp_path / "haproxy"
    out.mkdir()
    proc = apply(tmp_path, out, **{variable: value})
    assert proc.returncode != 0
    assert words in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert list(out.iterdir()) == []


def test_two_nodes_on_one_server_address_are_refused(tmp_path):
    out = tmp_path / "haproxy"
    out.mkdir()
    proc = apply(tmp_path, out, vllm_fleet_lb_nodes=["node01", "node03"], vllm_fleet_lb_server_address="10.0.0.9")
    assert proc.returncode != 0 and "unique address:port" in proc.stdout, proc.stdout[-3000:]


def test_a_config_haproxy_rejects_never_replaces_the_old_one(rendered, tmp_path):
    """The negative control of haproxy -c: a check interval of 0 passes the role's own checks
    (an HAProxy time) but not HAProxy's, and the config in place stays as it was."""
    before = (rendered / "haproxy.cfg").read_text()
    proc = apply(tmp_path, rendered, vllm_fleet_lb_check_inter="0")
    assert proc.returncode != 0 and "failed to validate" in proc.stdout, proc.stdout[-3000:]
    assert (rendered / "haproxy.cfg").read_text() == before


def stand_in_socket(path: Path, answer: bytes) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def serve():
        connection, _ = server.accept()
        connection.recv(1024)
        connection.sendall(answer)
        connection.close()
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


STATE = (b"1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n"
         b"3 vllm 1 node01 127.0.0.1 2 8\n\n")


def test_the_state_dump_writes_what_haproxy_says(tmp_path):
    thread = stand_in_socket(tmp_path / "admin.sock", STATE)
    proc = subprocess.run([str(SAVE_STATE), str(tmp_path / "admin.sock"), str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=30)
    thread.join(5)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "state").read_bytes() == STATE
    assert not (tmp_path / "state.tmp").exists()


@pytest.mark.parametrize("answer", [None, b"Unknown command\n"])
def test_a_failed_dump_removes_the_stale_state_and_fails(tmp_path, answer):
    """A reload that runs it first is refused; the next start has no stale drains."""
    (tmp_path / "state").write_bytes(STATE)
    if answer is not None:
        thread = stand_in_socket(tmp_path / "admin.sock", answer)
    proc = subprocess.run([str(SAVE_STATE), str(tmp_path / "admin.sock"), str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=30)
    if answer is not None:
        thread.join(5)
    assert proc.returncode == 1
    assert "no server state from HAProxy at " + str(tmp_path / "admin.sock") in proc.stderr
    assert not (tmp_path / "state").exists()
