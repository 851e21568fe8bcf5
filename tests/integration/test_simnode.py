"""The simulated node is a real systemd host that Ansible and nvidia-ml-py can use."""
import json
import os
import subprocess
import uuid
from pathlib import Path

import yaml

from tests.fixtures.simnode import simnode

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / ".venv" / "bin" / "ansible"
PYNVML_NAME = (
    "import pynvml; pynvml.nvmlInit(); "
    "print(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))"
)


def ansible(inventory: Path, *args: str) -> dict:
    """Run an ad-hoc module on all hosts; return {host: result} from the json callback."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
    }
    proc = subprocess.run([str(ANSIBLE), "all", "-i", str(inventory), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]


def test_systemd_is_pid1_and_running(sim_nodes):
    (node,) = sim_nodes({"plain": None})
    assert node.exec(["ps", "-o", "comm=", "-p", "1"]).stdout.strip() == "systemd"
    # "running", not just "degraded": no unit fails on a fresh node
    assert node.exec(["systemctl", "is-system-running"]).stdout.strip() == "running"
    assert node.exec(["hostname"]).stdout.strip() == "plain"
    assert node.boot_seconds < 15, f"boot took {node.boot_seconds:.1f} s"


def test_ansible_reaches_nodes_over_ssh_with_their_own_host_keys(sim_nodes, tmp_path):
    nodes = sim_nodes({"canary1": None, "node2": None})
    inventory = simnode.write_inventory(nodes, tmp_path / "hosts.yml",
                                        groups={"canary": ["canary1"], "fleet": ["node2"]})

    ping = ansible(inventory, "-m", "ansible.builtin.ping")
    assert {host: r["ping"] for host, r in ping.items()} == {"canary1": "pong", "node2": "pong"}

    facts = ansible(inventory, "-m", "ansible.builtin.setup", "-a", "filter=ansible_service_mgr")
    assert {host: r["ansible_facts"]["ansible_service_mgr"] for host, r in facts.items()} == {
        "canary1": "systemd", "node2": "systemd"}

    # Each node made its own host key at boot; Ansible checked it against known_hosts.
    access = nodes[0].access
    keys = {line.split()[0]: line.split()[2] for line in access.known_hosts.read_text().splitlines()}
    assert len({keys[f"[127.0.0.1]:{n.ssh_port}"] for n in nodes}) == 2
    for node in nodes:
        shown = node.exec(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout.split()[1]
        assert shown == keys[f"[127.0.0.1]:{node.ssh_port}"]

    # Negative control: node2 answering with canary1's key is refused, not trusted.
    forged = tmp_path / "forged_known_hosts"
    forged.write_text(f"[127.0.0.1]:{nodes[1].ssh_port} ssh-ed25519 {keys[f'[127.0.0.1]:{nodes[0].ssh_port}']}\n")
    bad = yaml.safe_load(inventory.read_text())
    bad["all"]["hosts"]["node2"]["ansible_ssh_common_args"] = (
        f"-o UserKnownHostsFile={forged} -o StrictHostKeyChecking=yes -o ControlPath=none")
    (tmp_path / "forged.yml").write_text(yaml.safe_dump(bad))
    proc = subprocess.run([str(ANSIBLE), "node2", "-i", str(tmp_path / "forged.yml"), "-m", "ansible.builtin.ping"],
                          cwd=ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "UNREACHABLE" in proc.stdout and "Host key verification failed" in proc.stdout + proc.stderr, proc.stdout


def test_transient_unit_logs_to_journal(sim_nodes):
    (node,) = sim_nodes({"plain": None})
    marker = uuid.uuid4().hex
    run = node.exec(["systemd-run", "--wait", "--unit", "vf-probe", "echo", marker])
    assert run.returncode == 0, run.stderr
    journal = node.exec(["journalctl", "--no-pager", "-o", "cat", "-u", "vf-probe"])
    assert marker in journal.stdout.splitlines()


def test_fake_nvml_is_the_nodes_driver(sim_nodes):
    gpu, bare = sim_nodes({"gpu1": "rtx_pro_6000", "bare": None})

    answer = gpu.exec(["python3", "-c", PYNVML_NAME])
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    # in the loader cache, like a real driver's library (listed under /lib: merged /usr)
    assert "\tlibnvidia-ml.so.1 (libc6,x86-64) => " in gpu.exec(["ldconfig", "-p"]).stdout

    missing = bare.exec(["python3", "-c", PYNVML_NAME])
    assert missing.returncode != 0
    assert "NVMLError_LibraryNotFound" in missing.stderr
