"""preflight, serve_config and controller_file run on the controller (their action plugins): a
node that cannot be reached still gets its verdict, its rendered config and its report, where a
module that needs the node (the negative control) is unreachable. rollout_lock runs in the
controller's process on a lock host reached through the local connection, and as a module on
any other."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CATALOGUE = yaml.safe_load((ROOT / "catalogue" / "known_issues.yml").read_text())
SCHEMA = yaml.safe_load((ROOT / "catalogue" / "vllm_serve_args.yml").read_text())
PROFILE = yaml.safe_load((ROOT / "profiles" / "qwen3.6-35b-a3b-nvfp4-sm120.yml").read_text())
GPU = {"available": True, "error": None, "reason": None, "driver_version": "580.95.05",
       "cuda_driver_version": "13.0", "device_count": 1,
       "devices": [{"index": 0, "compute_capability": "12.0", "sm": "sm_120"}]}
PLAN = {"versions": {"vllm": "0.25.1", "torch": "2.11.0", "cudnn": "9.24.0.43"},
        "serve_args": PROFILE["serve_args"], "env": PROFILE["env"]}

PLAYBOOK = """
- hosts: offline
  gather_facts: false
  vars_files: [vars.json]
  tasks:
    - name: Judge
      vllm_fleet.fleet.preflight: {catalogue: "{{ catalogue }}", gpu: "{{ gpu }}", planned: "{{ plan }}"}
      register: judged

    - name: Render
      vllm_fleet.fleet.serve_config: {schema: "{{ schema }}", profile: "{{ profile }}", role_args: {port: 8000}}
      register: rendered

    - name: Reach the node (the negative control)
      ansible.builtin.ping:
      ignore_unreachable: true
      register: reached

    - name: Save what each task said
      ansible.builtin.copy:
        content: "{{ {'judged': judged, 'rendered': rendered, 'reached': reached} | to_json }}"
        dest: "{{ results_path }}"
        mode: "0600"
      delegate_to: localhost
"""


def play_offline(tmp_path, playbook: str, hosts: str = "", **extra_vars) -> None:
    """Run playbook against a host whose every connection is refused at once (port 1 here), and
    the inventory lines in hosts (then with no interpreter forced on every host)."""
    (tmp_path / "playbook.yml").write_text(playbook)
    (tmp_path / "hosts").write_text(
        "offline ansible_host=127.0.0.1 ansible_port=1 ansible_connection=ssh ansible_user=nobody\n" + hosts)
    extra = [arg for key, value in extra_vars.items() for arg in ("-e", f"{key}={value}")]
    if not hosts:
        extra += ["-e", f"ansible_python_interpreter={sys.executable}"]
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts"), *extra, str(tmp_path / "playbook.yml")],
        cwd=ROOT, env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_HOST_KEY_CHECKING="False"),
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_both_run_without_reaching_the_node(tmp_path):
    (tmp_path / "vars.json").write_text(json.dumps(
        {"catalogue": CATALOGUE, "gpu": GPU, "plan": PLAN, "schema": SCHEMA, "profile": PROFILE}))
    results = tmp_path / "results.json"
    play_offline(tmp_path, PLAYBOOK, results_path=results)
    said = json.loads(results.read_text())
    assert said["reached"].get("unreachable") is True  # the node really cannot be reached
    assert said["judged"]["preflight"]["verdict"] in ("ok", "warn") and said["judged"]["changed"] is False
    assert said["rendered"]["content"].startswith("model: ") and said["rendered"]["config"]["port"] == 8000


FILE_PLAYBOOK = """
- hosts: offline
  gather_facts: false
  tasks:
    - name: Write a report
      vllm_fleet.fleet.controller_file:
        path: "{{ out }}/rollout/{{ inventory_hostname }}.json"
        data: {host: "{{ inventory_hostname }}", soak: null, marks: {started: 1.5}, note: "naïve"}
      register: first

    - name: The same again
      vllm_fleet.fleet.controller_file:
        path: "{{ out }}/rollout/{{ inventory_hostname }}.json"
        data: {host: "{{ inventory_hostname }}", soak: null, marks: {started: 1.5}, note: "naïve"}
      register: again

    - name: Append twice
      vllm_fleet.fleet.controller_file:
        path: "{{ out }}/notifications.json"
        data: ["{{ item }}"]
        append: true
      loop: [one, two]

    - name: A mode that is not octal
      vllm_fleet.fleet.controller_file: {path: "{{ out }}/bad.json", data: {}, mode: rw-r--r--}
      register: bad
      ignore_errors: true

    - name: Reach the node (the negative control)
      ansible.builtin.ping:
      ignore_unreachable: true
      register: reached

    - name: Save what the tasks said
      vllm_fleet.fleet.controller_file:
        path: "{{ out }}/said.json"
        data: {first: "{{ first }}", again: "{{ again }}", bad: "{{ bad }}", reached: "{{ reached }}"}
"""


def test_the_action_writes_on_the_controller_without_reaching_the_node(tmp_path):
    out = tmp_path / "out"
    play_offline(tmp_path, FILE_PLAYBOOK, out=out)
    said = json.loads((out / "said.json").read_text())
    assert said["reached"].get("unreachable") is True
    assert (said["first"]["changed"], said["again"]["changed"]) == (True, False)
    assert said["bad"]["failed"] is True and said["bad"]["msg"] == (
        "controller_file: mode 'rw-r--r--' is not octal text such as '0644'")
    report = (out / "rollout" / "offline.json").read_text()
    # The text the to_nice_json filter wrote before: sorted keys, 4 spaces, ASCII, a final newline.
    assert report == json.dumps({"host": "offline", "soak": None, "marks": {"started": 1.5}, "note": "naïve"},
                                indent=4, sort_keys=True, separators=(",", ": ")) + "\n"
    assert json.loads((out / "notifications.json").read_text()) == ["one", "two"]


LOCK_PLAYBOOK = """
- hosts: offline
  gather_facts: false
  tasks:
    - name: Take the lock on the controller
      vllm_fleet.fleet.rollout_lock: {path: "{{ out }}/rollout.lock", holder: run-1, controller: ctl, pid: 7, user: me}
      delegate_to: controller
      register: taken

    - name: Keep the lease as written
      ansible.builtin.set_fact:
        lease: "{{ lookup('ansible.builtin.file', out ~ '/rollout.lock') | from_json }}"

    - name: Another run is refused
      vllm_fleet.fleet.rollout_lock: {path: "{{ out }}/rollout.lock", holder: run-2}
      delegate_to: controller
      register: refused
      ignore_errors: true

    - name: Release it
      vllm_fleet.fleet.rollout_lock: {path: "{{ out }}/rollout.lock", holder: run-1, state: absent}
      delegate_to: controller
      register: released

    - name: On a lock host reached over SSH the module runs there (the negative control)
      vllm_fleet.fleet.rollout_lock: {path: "{{ out }}/remote.lock", holder: run-1}
      ignore_unreachable: true
      register: remote

    - name: Save what the tasks said
      vllm_fleet.fleet.controller_file:
        path: "{{ out }}/said.json"
        data: {taken: "{{ taken }}", lease: "{{ lease }}", refused: "{{ refused }}", released: "{{ released }}",
               remote: "{{ remote }}"}
"""


def test_the_lock_on_the_controller_is_taken_in_its_own_process(tmp_path):
    out = tmp_path / "out"
    # A module on the controller would need a Python; this one cannot start.
    play_offline(tmp_path, LOCK_PLAYBOOK, hosts="controller ansible_connection=local ansible_python_interpreter=/bin/false\n",
                 out=out)
    said = json.loads((out / "said.json").read_text())
    assert said["taken"]["changed"] is True and said["taken"]["lease"]["holder"] == "run-1"
    assert {k: said["lease"][k] for k in ("holder", "controller", "pid", "user")} == {
        "holder": "run-1", "controller": "ctl", "pid": 7, "user": "me"}
    assert said["refused"]["failed"] is True and "Another rollout holds the rollout lock" in said["refused"]["msg"]
    assert said["released"]["changed"] is True and not (out / "rollout.lock").exists()
    assert said["remote"].get("unreachable") is True and not (out / "remote.lock").exists()
