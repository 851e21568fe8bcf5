"""fleet_defaults tasks_from: instances checks the inventory host name before any role uses it
in a controller path or a load-balancer command (issue 14). Runs the real tasks with a local
connection: a host name with a shell or path character is refused, a plain one passes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAY = """- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: vllm_fleet.fleet.fleet_defaults
        tasks_from: instances
"""


def run(tmp_path, host):
    (tmp_path / "play.yml").write_text(PLAY)
    inventory = {"all": {"hosts": {host: {"ansible_connection": "local",
                                          "ansible_python_interpreter": sys.executable}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections")}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.json"),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120, check=False)


@pytest.mark.parametrize("host", ["node01;reboot", "../../etc/x", "node 01", "node01\\n"])
def test_an_inventory_host_name_that_is_no_host_name_is_refused(tmp_path, host):
    proc = run(tmp_path, host)
    assert proc.returncode != 0
    assert "is not a host name or address" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("host", ["node01", "gpu-7.example.org", "10.0.0.7"])
def test_a_plain_host_name_passes(tmp_path, host):  # negative control
    proc = run(tmp_path, host)
    assert proc.returncode == 0, proc.stdout[-2000:]
