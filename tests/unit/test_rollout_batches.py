"""The batches of the rollout plan, as Ansible's serial makes them (checked against Ansible's
own batching by running a play)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.filter.rollout_batches import rollout_batches

ROOT = Path(__file__).resolve().parents[2]
HOSTS = [f"n{i}" for i in range(1, 8)]


@pytest.mark.parametrize("plan, expected", [
    ([1, 2, "50%", "100%"], [["n1"], ["n2", "n3"], ["n4", "n5", "n6"], ["n7"]]),
    ([1], [[h] for h in HOSTS]),
    (["10%"], [[h] for h in HOSTS]),  # 0.7 of a node rounds down to 0: at least one
    ([3, "100%"], [["n1", "n2", "n3"], ["n4", "n5", "n6", "n7"]]),
    ([20], [HOSTS]),
])
def test_batches_follow_serial(plan, expected):
    assert rollout_batches(HOSTS, plan) == expected


@pytest.mark.parametrize("plan", [[1, 2, "50%", "100%"], ["30%", 2], [2, "10%"]])
def test_batches_match_what_ansible_runs(tmp_path, plan):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {h: {"ansible_connection": "local"} for h in HOSTS}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "serial": plan, "tasks": [
        {"ansible.builtin.debug": {"msg": "BATCH {{ ansible_play_batch | to_json }}"}, "run_once": True}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json"}
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook)],
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    runs = [json.loads(task["hosts"][host]["msg"].split(" ", 1)[1])
            for play in json.loads(out)["plays"] for task in play["tasks"] for host in task["hosts"]]
    assert runs == rollout_batches(HOSTS, plan)


def _batched_play(tmp_path, inventory_vars: dict, *args: str) -> subprocess.CompletedProcess:
    """rollout.yml's batched play as written (hosts, serial, vars), running only rollout_node's
    batch check, on seven local hosts."""
    import yaml

    play = next(play for play in yaml.safe_load((ROOT / "playbooks" / "rollout.yml").read_text()) if "serial" in play
                and play["serial"] == "{{ vllm_fleet_rollout_batches }}")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"vars": inventory_vars,
                                             "hosts": {h: {"ansible_connection": "local"} for h in HOSTS}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{
        "hosts": "all", "gather_facts": False, "serial": play["serial"], "vars": play["vars"],
        "any_errors_fatal": play["any_errors_fatal"],
        "tasks": [{"ansible.builtin.import_role": {"name": "vllm_fleet.fleet.rollout_node", "tasks_from": "batch"}}],
    }]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook),
                           *args], env=env, capture_output=True, text=True, cwd=ROOT)


def test_a_plan_set_in_the_inventory_is_refused_at_its_first_batch(tmp_path):
    # serial cannot read it: Ansible batches by the default ([1, 2, ...]) while the plan says 3.
    run = _batched_play(tmp_path, {"vllm_fleet_rollout_batches": [3]})
    assert run.returncode != 0
    assert "vllm_fleet_rollout_batches is [3] for these nodes, but Ansible runs the batch [\"n1\"]" in run.stdout
    assert run.stdout.count("PLAY [") == 1  # halted in the first batch


@pytest.mark.parametrize("given, batches", [(None, 4), ([3], 3)])  # the default: 1, 2, 3, 1; [3]: 3, 3, 1
def test_the_default_plan_and_one_given_with_e_pass_batch_by_batch(tmp_path, given, batches):
    run = _batched_play(tmp_path, {}, *(["-e", json.dumps({"vllm_fleet_rollout_batches": given})] if given else []))
    assert run.returncode == 0, run.stdout
    assert run.stdout.count("PLAY [") == batches  # Ansible prints the play's header once per batch


def test_the_batches_follow_the_inventory_whatever_order_the_turns_group_holds(tmp_path):
    """The opening play's group_by fills vllm_fleet_rollout_turns in the order results came
    back (a CI run rolled node03 before node02): rollout.yml's canary and batch plays, with
    their host patterns as written, must still batch in the inventory's order."""
    import yaml

    plays = yaml.safe_load((ROOT / "playbooks" / "rollout.yml").read_text())
    canary_play = next(play for play in plays if play.get("serial") == 1)
    batch_play = next(play for play in plays if play.get("serial") == "{{ vllm_fleet_rollout_batches }}")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {h: {"ansible_connection": "local"} for h in HOSTS},
                                             "children": {"canary": {"hosts": {"n1": {}}}}}}))
    scrambled = ["n5", "n3", "n7", "n1", "n2", "n6", "n4"]
    report = {"ansible.builtin.debug": {"msg": "BATCH {{ ansible_play_batch | to_json }}"}, "run_once": True}
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([
        {"hosts": "localhost", "gather_facts": False, "tasks": [
            {"ansible.builtin.add_host": {"name": "{{ item }}", "groups": "vllm_fleet_rollout_turns"},
             "loop": scrambled}]},
        {"hosts": canary_play["hosts"], "gather_facts": False, "serial": 1, "tasks": [report]},
        {"hosts": batch_play["hosts"], "gather_facts": False, "serial": [1, 2, "100%"], "tasks": [report]},
    ]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json"}
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook)],
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    runs = [json.loads(task["hosts"][host]["msg"].split(" ", 1)[1])
            for play in json.loads(out)["plays"][1:] for task in play["tasks"] for host in task["hosts"]]
    assert runs == [["n1"], ["n2"], ["n3", "n4"], ["n5", "n6", "n7"]]
