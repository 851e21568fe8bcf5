"""The fault matrix, part 2 (docs/FAULTS.md): what goes wrong during a node's turn, on a
simulated fleet of two sm_120 nodes behind a real HAProxy, provisioned with the fixed
release and the NVFP4 profile: one fault per test, injected into a real rollout. Each ends
with the node that met the fault serving its last known-good release, no more than one
batch out of HAProxy at any moment (a monitor samples HAProxy's admin and operational state
the whole time), client traffic through HAProxy with 0 failed, 0 retried and 0
redispatched requests, the rollout halted with a reason that names the fault, and a
re-run, with the fault gone, that converges. A negative control runs a copy of the rollout
with its drain removed and shows that these checks catch it.

The crash during a soak and the known-bad plan are in test_rollout.py (the story, with
client traffic through HAProxy); the faults before a turn (preflight, the pre-stage) in
test_faults_install.py. Tests run in file order on one fleet, each starting where the one
before converged, so that every converging re-run is a real cutover and not a skip.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fixtures.simnode.fleet import Traffic
from tests.fixtures.story import EXIT0, FIXED, FIXED_ID, FLEET_VARS, NVFP4, SERVED, clear_reports, node_exec, \
    provisioned_fleet, report, state
from tests.integration.faults import (FAST, NODES, assert_converges, assert_serves, completes, during_the_next_soak,
                                      rollout, seqs)
from tests.integration.playbook import ROOT, vllm_fleet


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("faults"), f"vf-fault-{os.getpid()}-", len(NODES),
                           release=FIXED, profile_=NVFP4, accept=[EXIT0], group_vars=FAST) as sim:
        yield sim


def test_a_service_that_never_gets_ready_is_rolled_back(fleet):
    never = dict(NVFP4, name="nvfp4-never-ready", env={**NVFP4["env"], "VLLM_STANDIN_LOAD_SECONDS": "3600"})
    run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=never,
                            vllm_fleet_service_ready_timeout=15)

    assert run.rc != 0
    assert "rollout halted at node01" in run.output and "rolled back to " + FIXED_ID in run.output, run.output[-4000:]
    canary = report(fleet, "node01")
    assert canary["status"] == "rolled_back" and set(canary["marks"]) == {"started", "drained", "configured"}, canary
    assert traffic.most_out == 1
    traffic.assert_clean()
    assert_serves(fleet, "node01", FIXED_ID, NVFP4["name"])  # the known-good release and profile

    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=seqs(96),
                     serving={"node01": (FIXED_ID, "nvfp4-seqs-96")})


def test_a_slower_release_fails_the_performance_gate_and_is_rolled_back(fleet):
    """--enforce-eager (no CUDA graphs) hides the sm_120 crash and gives back the NVFP4 win:
    the performance gate, on in every test with the fleet's baseline matched to its soak,
    fails it by its tokens/s. A 20 s soak: a loaded machine's load generator may take seconds
    to start, and 6 s could leave too little load to judge. The fleet is left as it was, so
    no re-run to converge."""
    before = state(fleet, "node01")
    eager = dict(NVFP4, name="nvfp4-eager", serve_args={**NVFP4["serve_args"], "enforce-eager": True})
    run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=eager, vllm_fleet_soak_duration_s=20)

    assert run.rc != 0
    assert "rollout halted at node01" in run.output and "rolled back to " + FIXED_ID in run.output, run.output[-4000:]
    canary = report(fleet, "node01")
    assert canary["status"] == "rolled_back" and canary["soak"]["passed"] is False, canary
    reason = re.fullmatch(r"total_token_throughput: ([\d,]+) tokens/s is (\d+\.\d)% below the baseline ([\d,]+) "
                          r"\(tolerance (\d+)%\)\.", canary["soak"]["reasons"][0])
    assert reason, canary["soak"]["reasons"]
    observed, below, base, tolerance = (float(g.replace(",", "")) for g in reason.groups())
    assert base == FLEET_VARS["vllm_fleet_soak_baseline"]["total_token_throughput"]
    assert below > tolerance and observed == pytest.approx(base * (1 - below / 100), rel=0.002)
    assert "soak gate failed on node01: " + canary["soak"]["reasons"][0] in run.output
    assert traffic.most_out == 1
    traffic.assert_clean()
    assert_serves(fleet, "node01", FIXED_ID, before["profile"])


def test_haproxy_unreachable_halts_the_turn_without_touching_the_node(fleet):
    before = {node: state(fleet, node) for node in NODES}
    fleet.stop_haproxy()
    try:
        run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=seqs(80))
    finally:
        fleet.start_haproxy(NODES)

    assert run.rc != 0
    assert "rollout halted at node01" in run.output, run.output[-4000:]
    assert "HAProxy did not set node01" in run.output and str(fleet.haproxy_socket) in run.output
    canary = report(fleet, "node01")
    assert canary["status"] == "failed" and set(canary["marks"]) == {"started"}, canary
    # Not stopped, not restarted, not reconfigured: the same process serves the same profile.
    assert {node: state(fleet, node) for node in NODES} == before
    assert completes(fleet, "node01")

    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=seqs(80),
                     serving={"node01": (FIXED_ID, "nvfp4-seqs-80")})


def test_a_node_unreachable_midway_halts_the_rollout_and_a_rerun_finishes_it(fleet):
    target = seqs(72)
    node02_before = state(fleet, "node02")
    pause = ["podman", "pause", fleet.prefix + "node02"]  # Ansible: UNREACHABLE
    try:
        with during_the_next_soak(fleet, "node01", lambda: subprocess.run(pause, check=True, timeout=60)):
            run, traffic = rollout(fleet, release=FIXED, profile_=target)
    finally:
        subprocess.run(["podman", "unpause", fleet.prefix + "node02"], timeout=60)
    # HAProxy's checks marked the paused node DOWN; they bring it back, not the rollout.
    assert fleet.wait_in_traffic() == set()

    assert run.rc != 0
    assert "UNREACHABLE" in run.output and "node02" in run.output, run.output[-4000:]
    assert report(fleet, "node01")["status"] == "upgraded"
    assert report(fleet, "node02") is None  # its turn never began: never drained
    # The rollout drained one node at a time; HAProxy's own checks may mark the paused node02
    # DOWN meanwhile, and its clients' requests fail: that is the fault, not the rollout.
    assert traffic.most_drained == 1
    assert state(fleet, "node02") == node02_before
    assert_serves(fleet, "node02", FIXED_ID, NVFP4["name"])

    assert_converges(fleet, release=FIXED, profile_=target, serving={n: (FIXED_ID, "nvfp4-seqs-72") for n in NODES})
    assert (report(fleet, "node01")["status"], report(fleet, "node02")["status"]) == ("skipped", "upgraded")


def test_a_wedge_during_the_canary_soak_fails_the_gate_and_a_rerun_passes(fleet, tmp_path):
    target = seqs(64)
    before = state(fleet, "node01")
    wedge = "systemctl kill -s SIGUSR1 vllm@gpu0"  # the engine stops making progress
    plan = ["-e", json.dumps({"vllm_fleet_release": FIXED, "vllm_fleet_profile": target,
                              "vllm_fleet_accepted_risks": [EXIT0]})]
    # The wedge lands some seconds into the soak (later on a loaded machine): a soak long enough
    # for the wedge window to close after it, which the monitor ends at the wedge.
    long_soak = ["-e", json.dumps({"vllm_fleet_soak_duration_s": 60})]
    with during_the_next_soak(fleet, "node01", lambda: node_exec(fleet, "node01", wedge)), \
            Traffic(fleet, SERVED, workers=2) as traffic:
        code, output, summary, junit = vllm_fleet(tmp_path / "wedged", "rollout", "-i", str(fleet.inventory),
                                                  "--limit", "canary", *plan, *long_soak, timeout=1200)

    assert code == 4, output[-4000:]  # the soak gate failed
    assert (summary["outcome"], summary["exit_code"]) == ("gate_failed", 4)
    canary = summary["hosts"]["node01"]
    assert (canary["status"], canary["soak_verdict"]) == ("rolled_back", "failed"), canary
    assert "wedge" in (canary["message"] or ""), canary
    kept = json.loads((Path(summary["artifacts"]) / "reports" / "rollout" / "node01.json").read_text())
    assert any("wedge" in reason for reason in kept["soak"]["reasons"]), kept["soak"]["reasons"]
    assert set(kept["marks"]) == {"started", "drained", "configured", "ready"}  # it never reached a verdict mark
    assert traffic.most_out == 1
    traffic.assert_clean()
    assert_serves(fleet, "node01", before["known_good"], before["profile"])

    # The wedge was a one-off: the same plan again passes.
    code, output, summary, junit = vllm_fleet(tmp_path / "again", "rollout", "-i", str(fleet.inventory),
                                              "--limit", "canary", *plan, timeout=1200)
    assert code == 0, output[-4000:]
    assert summary["hosts"]["node01"]["status"] == "upgraded"
    assert_serves(fleet, "node01", FIXED_ID, "nvfp4-seqs-64")


def test_the_controller_killed_midway_and_a_rerun_finishes_without_redoing_the_canary(fleet):
    target = seqs(56)
    clear_reports(fleet)
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(fleet.inventory), "rollout.yml",
               "-e", json.dumps({"vllm_fleet_release": FIXED, "vllm_fleet_profile": target,
                                 "vllm_fleet_accepted_risks": [EXIT0],
                                 "vllm_fleet_report_dir": str(fleet.directory / "reports")})]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections")}
    node02_before = state(fleet, "node02")
    with Traffic(fleet, SERVED, workers=2) as traffic:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and (report(fleet, "node01") or {}).get("status") != "upgraded":
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)  # the controller dies between the canary and the next batch
        proc.wait()

    assert report(fleet, "node01")["status"] == "upgraded"
    assert traffic.most_out == 1 and fleet.lb_out() == set()
    traffic.assert_clean()
    assert state(fleet, "node02") == node02_before
    canary_after_first = state(fleet, "node01")
    # The killed run's rollout lock stays (nothing ran to release it); its process is gone from
    # this controller, so the lease is stale and the re-run breaks it by naming its holder.
    lease = json.loads((fleet.directory / "rollout.lock").read_text())
    assert lease["pid"] == proc.pid

    assert_converges(fleet, "-e", f"vllm_fleet_rollout_break_lock={lease['holder']}", release=FIXED, profile_=target,
                     serving={n: (FIXED_ID, "nvfp4-seqs-56") for n in NODES})
    assert (report(fleet, "node01")["status"], report(fleet, "node02")["status"]) == ("skipped", "upgraded")
    assert state(fleet, "node01") == canary_after_first  # no restart, no second soak


def test_a_server_name_haproxy_does_not_know_halts_before_the_node_stops(fleet):
    target = seqs(48)
    before = {node: state(fleet, node) for node in NODES}
    fleet.start_haproxy(["node-01", "node02"])  # node01's server misnamed: a drain of node01 would drain nothing
    try:
        run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=target)
    finally:
        fleet.start_haproxy(NODES)

    assert run.rc != 0
    assert "rollout halted at node01" in run.output, run.output[-4000:]
    assert "has no server node01 for host node01; its servers are: node-01, node02" in run.output, \
        run.output[-4000:]
    assert {node: state(fleet, node) for node in NODES} == before  # never stopped, never reconfigured
    assert set(report(fleet, "node01")["marks"]) == {"started"}
    assert traffic.most_drained == 0
    traffic.assert_clean()

    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=target,
                     serving={"node01": (FIXED_ID, "nvfp4-seqs-48")})


def without_the_drain(tree: Path) -> Path:
    """A copy of this checkout whose rollout never drains a node in HAProxy (drain.yml
    emptied), with its own collections/ link: the broken rollout the traffic
    checks must catch. Made here, never a switch in the product."""
    tree.mkdir(parents=True)
    for part in ("rollout.yml", "ansible.cfg", "galaxy.yml", "meta", "playbooks", "plugins", "roles",
                 "catalogue", "profiles"):
        source = ROOT / part
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, tree / part)
    link = tree / "collections" / "ansible_collections" / "vllm_fleet" / "fleet"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../..")
    # The whole of drain.yml: without the drain, its wait for HAProxy to have no session open
    # on the node would (rightly) refuse to stop a node clients still reach.
    drain = tree / "roles" / "rollout_node" / "tasks" / "drain.yml"
    tasks = yaml.safe_load(drain.read_text())
    assert tasks[0]["name"] == "Drain the node in the load balancer", "drain.yml changed: update this negative control"
    drain.write_text("[]\n")
    return tree


def test_negative_control_a_rollout_that_never_drains_fails_the_traffic_checks(fleet, tmp_path):
    tree = without_the_drain(tmp_path / "tree")
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(fleet.inventory), "rollout.yml",
               "--limit", "canary",
               "-e", json.dumps({"vllm_fleet_release": FIXED, "vllm_fleet_profile": seqs(40),
                                 "vllm_fleet_accepted_risks": [EXIT0],
                                 "vllm_fleet_report_dir": str(fleet.directory / "reports")})]
    env = {**os.environ, "ANSIBLE_CONFIG": str(tree / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(tree / "collections")}
    clear_reports(fleet)
    with Traffic(fleet, SERVED, workers=3) as traffic:
        proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=1200)

    # Whatever the broken rollout reports (it upgrades the canary when its soak passes under
    # the clients' load too), the node was never drained, yet went out of traffic (HAProxy's checks saw it DOWN):
    # a monitor of admin state alone would have seen nothing.
    assert traffic.most_drained == 0 and traffic.out_seen == {"node01"}, \
        (traffic.most_drained, traffic.out_seen, proc.stdout[-4000:])
    # ... and the requests that met the stopped node show, as client errors or as HAProxy's
    # retries and redispatches that hid them from the clients.
    summary = traffic.summary()
    print("rollout without a drain:", summary, "rc", proc.returncode)
    assert summary["failed"] + summary["retried"] + summary["redispatched"] > 0, summary
    with pytest.raises(AssertionError):
        traffic.assert_clean()
