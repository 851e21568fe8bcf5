"""rollout.yml's plan checks (roles/rollout_node/tasks/validate.yml), the first tasks of its
opening play: an empty canary group, a run of other nodes that leaves the canary out, a
batch plan taking more than vllm_fleet_rollout_max_out of the fleet out at once and bake
settings it cannot use are refused before any node is touched.

The inventory's nodes point at a port nothing listens on: a refusal must come before the
first connection (no UNREACHABLE in the output), and a plan that passes must get as far
as the first task that connects to a node (UNREACHABLE there) - the positive controls that
show each check lets a good plan through."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.fixtures.story import EXIT0, FIXED, NVFP4
from tests.integration.playbook import ansible_playbook

# Words of the refusals only (not of the task names).
REFUSALS = ("group canary is empty or missing", "but not the canary (", "out of traffic at once (batches",
            "is not a node count >= 1 or a")


def inventory(tmp_path, nodes: int = 4, canary: list[str] | None = None):
    names = [f"node{i:02d}" for i in range(1, nodes + 1)]
    canary = names[:1] if canary is None else canary
    hosts = {name: {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh",
                    "vllm_fleet_instances": [{"name": "gpu0", "gpu": 0, "port": 8001}]} for name in names}
    # A lease of its own: runs that pass the plan checks take the rollout lock on localhost.
    data = {"all": {"hosts": hosts, "vars": {"vllm_fleet_rollout_lock_path": str(tmp_path / "rollout.lock")},
                    "children": {
        "canary": {"hosts": {name: {} for name in canary}},
        "fleet": {"hosts": {name: {} for name in names if name not in canary}}}}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def rollout(tmp_path, *args, nodes: int = 4, canary: list[str] | None = None, **extra):
    return ansible_playbook("rollout.yml", inventory(tmp_path, nodes, canary), *args, extra_vars={
        "vllm_fleet_release": FIXED, "vllm_fleet_profile": NVFP4, "vllm_fleet_accepted_risks": [EXIT0],
        "vllm_fleet_report_dir": str(tmp_path / "reports"), **extra}, timeout=300)


def assert_refused(run, *words):
    assert run.rc != 0
    for word in words:
        assert word in run.output, (word, run.output[-3000:])
    assert "UNREACHABLE" not in run.output, run.output[-3000:]  # refused before any connection
    assert "Gather GPU facts" not in run.output


def assert_passes_the_plan_checks(run):
    assert "UNREACHABLE" in run.output, run.output[-3000:]  # went on to the first node task
    for refusal in REFUSALS:
        assert refusal not in run.output, (refusal, run.output[-3000:])


def test_an_empty_canary_group_is_refused(tmp_path):
    run = rollout(tmp_path, canary=[])
    assert_refused(run, "The inventory's group canary is empty or missing", "Put one node in the group canary")


def test_a_run_of_other_nodes_without_the_canary_is_refused(tmp_path):
    run = rollout(tmp_path, "--limit", "node02:node03")
    assert_refused(run, "This run targets node02, node03 but not the canary (node01)",
                   "--limit 'canary:node02:node03'")


@pytest.mark.parametrize("args", [(), ("--limit", "canary"), ("--limit", "canary:node02")],
                         ids=["full", "canary-alone", "canary-and-one"])
def test_runs_that_include_the_canary_pass(tmp_path, args):
    assert_passes_the_plan_checks(rollout(tmp_path, *args))


def test_a_batch_plan_taking_more_than_max_out_is_refused(tmp_path):
    # Six nodes: the canary, then five in batches [1, 4]: four of six out at once, over 50% (3).
    run = rollout(tmp_path, nodes=6, vllm_fleet_rollout_batches=[1, 4])
    assert_refused(run, "vllm_fleet_rollout_batches [1, 4] would take 4 of the fleet's 6 nodes out of traffic at once",
                   "vllm_fleet_rollout_max_out (50%: 3 nodes)", '"vllm_fleet_rollout_batches": [1, 3]')


def test_the_default_plan_and_a_raised_max_out_pass(tmp_path):
    # The default [1, 2, '50%', '100%'] on six nodes: batches of 1, 2, 2; and [1, 4] once 4 may be out.
    assert_passes_the_plan_checks(rollout(tmp_path / "default", nodes=6))
    assert_passes_the_plan_checks(rollout(tmp_path / "raised", nodes=6, vllm_fleet_rollout_batches=[1, 4],
                                          vllm_fleet_rollout_max_out=4))


def test_a_single_node_fleet_may_roll_its_canary(tmp_path):
    assert_passes_the_plan_checks(rollout(tmp_path, nodes=1))


@pytest.mark.parametrize("value", ["0", "150%", "half", "-1"])
def test_a_max_out_that_is_not_a_share_is_refused(tmp_path, value):
    assert_refused(rollout(tmp_path, vllm_fleet_rollout_max_out=value), f"vllm_fleet_rollout_max_out: \"{value}\"")


@pytest.mark.parametrize("name, value", [("vllm_fleet_bake_interval_s", 0), ("vllm_fleet_bake_max_kv_usage", 1.5),
                                         ("vllm_fleet_bake_max_5xx", "some")])
def test_bad_bake_settings_are_refused(tmp_path, name, value):
    # The last of the plan's checks: its message names every bake setting and what each takes.
    assert_refused(rollout(tmp_path, **{name: value}), "The bake's settings are not what it needs",
                   f"{name} {json.dumps(value)}")  # the message writes each value with to_json


def test_a_lock_host_that_is_no_host_name_is_refused(tmp_path):
    # The lock's other settings are refused on a fleet (test_rollout_lock.py); this one names
    # no host at all, so it is refused before any connection.
    assert_refused(rollout(tmp_path, vllm_fleet_rollout_lock_host="  "),
                   'vllm_fleet_rollout_lock_host: "  " is not a host name')
