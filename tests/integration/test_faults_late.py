"""The fault matrix, part 3 (docs/FAULTS.md): faults late in a node's turn, on a fleet of its
own (two sm_120 nodes on the fixed release with the NVFP4 profile, like test_faults.py's), so
that this file runs beside the other two parts.

- The controller interrupted during the canary's soak (fault 16; README "After an
  interrupted rollout"), by Ctrl-C (SIGINT to its process group) or SIGKILL. Nothing runs
  after that: the canary stays drained in HAProxy, on the target release but not
  known-good, its soak still loading it, and the run's rollout lock stays. The next run,
  told to break that stale lock by its holder id, finds the leftover soak, stops it (its
  whole process group) with a verdict that says so, and takes the canary's turn again from
  the drain: the canary ends upgraded and back in traffic, and no client noticed anything
  through both runs.
- A node that passes its soak but fails in client traffic (fault 14): the bake catches it.
- A node lost after its own drain (fault 18): the canary is paused during its soak. Ansible
  runs no rescue for an unreachable host, so the soak gate fails when its node stops
  answering; the rescue finds the node gone, keeps it drained in HAProxy, reports it
  `unreachable` with what HAProxy shows, releases the lock and halts (exit 5). Once the node
  answers again it is still out of traffic, and the next run takes its turn from the drain.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.simnode.fleet import Traffic
from tests.fixtures.story import EXIT0, FIXED, FIXED_ID, NVFP4, SERVED, clear_reports, node_exec, \
    provisioned_fleet, report, state
from tests.integration.faults import FAST, NODES, assert_converges, assert_serves, during_the_next_soak, rollout, \
    seqs
from tests.integration.playbook import ROOT, vllm_fleet


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("faults-late"), f"vf-late-{os.getpid()}-", len(NODES),
                           release=FIXED, profile_=NVFP4, accept=[EXIT0], group_vars=FAST) as sim:
        yield sim


def leftover_soak(sim) -> dict:
    """The canary's soak that has no verdict: its directory and the pid in its last progress line."""
    script = ("for d in /opt/vllm-fleet/current/soak/*/; do [ -e \"$d/verdict.json\" ] || "
              "{ echo \"$d\"; tail -n1 \"$d/progress.jsonl\"; }; done")
    lines = node_exec(sim, "node01", script).splitlines()
    return {"dir": lines[0].rstrip("/"), "pid": json.loads(lines[1])["pid"]} if len(lines) >= 2 else {}


def alive(sim, pid: int) -> bool:
    return node_exec(sim, "node01", f"kill -0 {pid} 2>/dev/null && echo yes") == "yes"


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_a_rollout_interrupted_during_the_soak_is_finished_by_the_next_run(fleet, how):
    target = seqs(24 if how == signal.SIGINT else 16)
    plan = {"vllm_fleet_release": FIXED, "vllm_fleet_profile": target, "vllm_fleet_accepted_risks": [EXIT0],
            "vllm_fleet_report_dir": str(fleet.directory / "reports")}
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(fleet.inventory), "rollout.yml",
               "--limit", "canary", "-e", json.dumps({**plan, "vllm_fleet_soak_duration_s": 120})]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections")}
    clear_reports(fleet)
    node02_before = state(fleet, "node02")
    with Traffic(fleet, SERVED, workers=2) as traffic:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 600  # until the canary's soak has written its first progress
        while time.monotonic() < deadline and not leftover_soak(fleet).get("pid"):
            time.sleep(0.5)
        os.killpg(proc.pid, how)
        proc.wait(60)

        # What the interrupted run left: the canary drained, its soak still running.
        left = leftover_soak(fleet)
        assert left and alive(fleet, left["pid"]), left
        assert fleet.lb_out() == {"node01"}
        assert report(fleet, "node01") is None  # its turn never reported
        lease_file = fleet.directory / "rollout.lock"
        holder = json.loads(lease_file.read_text())["holder"] if lease_file.exists() else ""

        run = subprocess.run(
            [*command[:-1], json.dumps({**plan, "vllm_fleet_rollout_break_lock": holder})],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)

    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "node01 was left by an interrupted rollout" in output and os.path.basename(left["dir"]) in output
    assert not alive(fleet, left["pid"])
    stopped = json.loads(node_exec(fleet, "node01", f"cat {left['dir']}/verdict.json"))
    assert stopped["stopped"] == "interrupted" and stopped["passed"] is False
    assert report(fleet, "node01")["status"] == "upgraded"
    assert_serves(fleet, "node01", FIXED_ID, target["name"])
    assert state(fleet, "node02") == node02_before
    # One node out at a time through both runs, and no client noticed.
    assert traffic.out_seen == {"node01"} and traffic.most_out == 1
    traffic.assert_clean()


def test_a_node_that_passes_its_soak_but_fails_in_traffic_fails_its_bake_and_is_rolled_back(fleet):
    """The stand-in goes bad 45 s after its model loaded (every completion a 500, /health and
    the metrics still green): after the short soak, in the bake, clients meet it, HAProxy
    counts the node's 5xx, and the bake drains it again, rolls it back and halts."""
    before = state(fleet, "node01")
    degrading = dict(seqs(32), name="nvfp4-degrading", env={**NVFP4["env"], "VLLM_STANDIN_FAIL_AFTER_SECONDS": "45"})
    lb_before = fleet.lb_servers()
    run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=degrading,
                           vllm_fleet_bake_s=90, vllm_fleet_bake_interval_s=1)

    assert run.rc != 0
    assert "rollout halted at node01" in run.output and "bake failed on node01" in run.output, run.output[-4000:]
    canary = report(fleet, "node01")
    assert canary["status"] == "rolled_back" and canary["soak"]["passed"] is True, canary
    bake = canary["bake"]
    assert bake["passed"] is False and bake["hrsp_5xx"] > 0 and bake["seconds"] < 90, bake
    assert "returned" in canary["marks"] and "baked" not in canary["marks"], canary["marks"]
    # Back on what it served before, in traffic; the other node never left it.
    after = state(fleet, "node01")
    assert (after["current"], after["known_good"], after["profile"]) == \
           (before["current"], before["known_good"], before["profile"])
    assert_serves(fleet, "node01", FIXED_ID, before["profile"])
    assert traffic.out_seen == {"node01"} and traffic.most_out == 1
    # Clients met the node that went bad (what a bake is for: a short soak did not show it),
    # and only that node: HAProxy counted no 5xx from node02.
    lb_after = fleet.lb_servers()
    print("bake failure:", bake, "clients:", traffic.summary())
    assert traffic.summary()["failed"] > 0
    assert lb_after["node02"]["hrsp_5xx"] == lb_before["node02"]["hrsp_5xx"]

    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=seqs(32),
                     serving={"node01": (FIXED_ID, "nvfp4-seqs-32")})


def test_a_node_lost_after_its_drain_is_kept_out_of_traffic_reported_and_finished_by_the_next_run(fleet, tmp_path):
    target = seqs(40)
    node02_before = state(fleet, "node02")
    plan = ["-e", json.dumps({"vllm_fleet_release": FIXED, "vllm_fleet_profile": target,
                              "vllm_fleet_accepted_risks": [EXIT0], "vllm_fleet_soak_duration_s": 60})]
    pause = ["podman", "pause", fleet.prefix + "node01"]  # frozen: SSH and HAProxy's checks time out
    try:
        with during_the_next_soak(fleet, "node01", lambda: subprocess.run(pause, check=True, timeout=60)), \
                Traffic(fleet, SERVED, workers=2) as traffic:
            code, output, summary, junit = vllm_fleet(tmp_path / "lost", "rollout", "-i", str(fleet.inventory),
                                                      "--limit", "canary", *plan, timeout=1200)
        lb_while_lost = fleet.lb_servers()["node01"]
    finally:
        subprocess.run(["podman", "unpause", fleet.prefix + "node01"], timeout=60)

    assert code == 5, output[-4000:]  # unreachable: not a failed gate, not a rollback
    canary = summary["hosts"]["node01"]
    assert canary["status"] == "unreachable" and canary["soak_verdict"] is None, canary
    assert "node01 stopped answering during its soak" in canary["message"], canary
    assert "nothing on it was rolled back" in output and "HAProxy keeps it out of traffic (node01 DRAIN/" in output
    kept = json.loads((Path(summary["artifacts"]) / "reports" / "rollout" / "node01.json").read_text())
    assert kept["status"] == "unreachable" and kept["lb_state"] == f"node01 DRAIN/{lb_while_lost['operational']}"
    assert {"drained", "configured", "ready"} <= set(kept["marks"]) and "soaked" not in kept["marks"], kept["marks"]
    assert lb_while_lost["admin"] == "DRAIN", lb_while_lost
    # It was out of traffic before it was lost: clients never met it.
    assert traffic.out_seen == {"node01"} and traffic.most_out == 1
    traffic.assert_clean()
    assert state(fleet, "node02") == node02_before

    # Answering again (HAProxy's checks pass), it stays drained: not proven, not in traffic.
    deadline = time.monotonic() + 30
    while fleet.lb_servers()["node01"]["operational"] != "UP" and time.monotonic() < deadline:
        time.sleep(0.5)
    back = fleet.lb_servers()["node01"]
    assert (back["admin"], back["operational"]) == ("DRAIN", "UP"), back
    # The halted run released its lock: a plain re-run finishes the turn.
    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=target,
                     serving={"node01": (FIXED_ID, target["name"])})
