"""The fault matrix (docs/FAULTS.md) on a simulated fleet of two sm_120 nodes behind a
real HAProxy: one fault per test, injected into a real rollout. Each ends with the node
that met the fault serving its last known-good release, no more than one batch out of
HAProxy at any moment (a monitor samples HAProxy's admin and operational state the whole
time), client traffic through HAProxy with 0 failed, 0 retried and 0 redispatched
requests (HAProxy's own counters: its retries would hide a dropped request), the rollout
halted with a reason that names the fault, and a re-run, with the fault gone, that
converges. A negative control runs a copy of the rollout with its drain removed and shows
that these checks catch it.

The crash during a soak and the known-bad plan are in test_rollout.py (the story, with
client traffic through HAProxy); this file has the rest. Tests run in file order
on one fleet, each starting where the one before converged, so that every converging
re-run is a real cutover (or a real install) and not a skip.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.fixtures.simnode.fleet import SimFleet, Traffic
from tests.fixtures.story import (EXIT0, FIXED, FIXED_ID, FLEET_VARS, NVFP4, PRE_FIX_ID, SERVED, clear_reports,
                                  node_exec, play, provisioned_fleet, report, state)
from tests.integration.playbook import ROOT
from tests.integration.test_cli import vllm_fleet

NODES = ["node01", "node02"]
# A second cuDNN-only bump, in the test wheelhouse: a release no node has staged yet.
BUMP = {**FIXED, "cudnn": "9.23.1.21"}
BUMP_ID = "vllm-0.25.1_nvidia-cudnn-cu13-9.23.1.21"
FAST = {**FLEET_VARS, "vllm_fleet_soak_duration_s": 6, "vllm_fleet_soak_min_duration_s": 3}
# /opt/vllm-fleet on a disk of its own, so that one can be filled.
DISK = "/opt/vllm-fleet:rw,exec,nosuid,nodev,mode=0755,size=768m"


def seqs(n: int) -> dict:
    """The NVFP4 profile with another max-num-seqs: a new target on the staged release."""
    return dict(NVFP4, name=f"nvfp4-seqs-{n}", serve_args={**NVFP4["serve_args"], "max-num-seqs": n})


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("faults"), f"vf-fault-{os.getpid()}-",
                           len(NODES), group_vars=FAST, tmpfs=(DISK,)) as sim:
        yield sim


def rollout(sim: SimFleet, *args: str, release: dict, profile_: dict, **extra):
    """rollout.yml with client traffic through HAProxy; returns the run and the Traffic
    (most nodes out at once, client errors, HAProxy's retries and redispatches)."""
    clear_reports(sim)
    with Traffic(sim, SERVED, workers=2) as traffic:
        run = play(sim, "rollout.yml", *args, release=release, profile_=profile_, accept=[EXIT0], **extra)
    return run, traffic


def completes(sim: SimFleet, node: str) -> bool:
    """A completion straight from the node (not through HAProxy)."""
    body = json.dumps({"model": SERVED, "prompt": "hello", "max_tokens": 2}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{sim.port(NODES.index(node) + 1)}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return bool(json.loads(response.read())["choices"])


def assert_serves(sim: SimFleet, node: str, release_id: str, profile_name: str):
    st = state(sim, node)
    assert (st["current"], st["known_good"], st["profile"], st["ActiveState"]) == \
           (release_id, release_id, profile_name, "active"), (node, st)
    assert completes(sim, node)
    assert node not in sim.lb_out()


def assert_converges(sim: SimFleet, *args: str, release: dict, profile_: dict, serving: dict[str, tuple]):
    """The re-run with the fault gone: it passes, one batch out at a time, and each node in
    serving ends on (release id, profile name)."""
    run, traffic = rollout(sim, *args, release=release, profile_=profile_)
    assert run.rc == 0, run.output[-4000:]
    assert traffic.most_out == 1
    traffic.assert_clean()
    for node, (release_id, profile_name) in serving.items():
        assert_serves(sim, node, release_id, profile_name)


def staged(sim: SimFleet, node: str) -> set[str]:
    return set(node_exec(sim, node, "ls -A /opt/vllm-fleet/releases").split())


def assert_halted_before_any_change(run, traffic: Traffic, sim: SimFleet, before: dict, *words: str):
    assert run.rc != 0
    for word in words:
        assert word in run.output, (word, run.output[-4000:])
    assert traffic.most_out == 0  # nobody left traffic
    traffic.assert_clean()
    assert {node: state(sim, node) for node in NODES} == before  # same links, profile, process
    # No turn started: a node that already served the target is recorded as skipped.
    reports = [report(sim, node) for node in NODES]
    assert all(r is None or r["status"] == "skipped" for r in reports), reports


def test_a_gpu_with_retired_pages_pending_blocks_the_plan_before_anything_changes(fleet):
    gpu = fleet.gpu_profile("node01")
    healthy = gpu.read_text()
    before = {node: state(fleet, node) for node in NODES}
    gpu.write_text(healthy.replace("0.retired_pages_pending=0", "0.retired_pages_pending=1"))  # in place: bind mount
    try:
        run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=NVFP4)
    finally:
        gpu.write_text(healthy)  # the GPU was reset

    assert_halted_before_any_change(run, traffic, fleet, before, "gpu-retired-pages-pending", "node01")
    assert FIXED_ID not in staged(fleet, "node01")

    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=NVFP4,
                     serving={"node01": (FIXED_ID, NVFP4["name"])})


def test_a_full_disk_during_the_install_halts_before_the_node_leaves_traffic(fleet):
    before = {node: state(fleet, node) for node in NODES}
    # Fill node02's /opt/vllm-fleet to the last block.
    node_exec(fleet, "node02", "cd /opt/vllm-fleet && fallocate -l $(df --output=avail -B1 . | tail -1) ballast;"
                               " dd if=/dev/zero of=ballast2 bs=4k 2>/dev/null; true")
    assert node_exec(fleet, "node02", "df --output=avail /opt/vllm-fleet | tail -1") == "0"
    try:
        run, traffic = rollout(fleet, release=FIXED, profile_=NVFP4)
    finally:
        node_exec(fleet, "node02", "rm -f /opt/vllm-fleet/ballast /opt/vllm-fleet/ballast2")

    assert_halted_before_any_change(run, traffic, fleet, before, "No space left on device", "node02",
                                    f"release {FIXED_ID}")
    assert staged(fleet, "node02") == {PRE_FIX_ID}  # no half-built release, no staging left behind

    assert_converges(fleet, release=FIXED, profile_=NVFP4, serving={n: (FIXED_ID, NVFP4["name"]) for n in NODES})
    assert (report(fleet, "node01")["status"], report(fleet, "node02")["status"]) == ("skipped", "upgraded")


def test_an_unreachable_index_halts_the_install_before_anything_changes(fleet):
    before = {node: state(fleet, node) for node in NODES}
    dead_index = "http://127.0.0.1:9/simple"  # discard port: nothing listens
    run, traffic = rollout(fleet, "--limit", "canary", release=BUMP, profile_=NVFP4,
                            vllm_fleet_runtime_offline=False, vllm_fleet_runtime_find_links=[],
                            vllm_fleet_runtime_index_url=dead_index)

    assert_halted_before_any_change(run, traffic, fleet, before, dead_index, f"release {BUMP_ID}")
    assert BUMP_ID not in staged(fleet, "node01") and not any(s.startswith(".staging") for s in staged(fleet, "node01"))

    assert_converges(fleet, "--limit", "canary", release=BUMP, profile_=NVFP4,
                     serving={"node01": (BUMP_ID, NVFP4["name"])})


def test_a_wheel_missing_from_the_wheelhouse_halts_the_install_naming_it(fleet):
    before = {node: state(fleet, node) for node in NODES}
    run, traffic = rollout(fleet, "--limit", "canary", release={**FIXED, "cudnn": "9.23.1.99"}, profile_=NVFP4)

    assert_halted_before_any_change(run, traffic, fleet, before, "nvidia-cudnn-cu13==9.23.1.99", "/srv/wheelhouse")
    assert not any(s.startswith(".staging") or "9.23.1.99" in s for s in staged(fleet, "node01"))

    # The pin corrected to the fixed release (staged, not served): a cutover, not an install.
    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=NVFP4,
                     serving={"node01": (FIXED_ID, NVFP4["name"])})


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


@contextmanager
def during_the_next_soak(sim: SimFleet, node: str, action):
    """Run action() once a new soak starts on node (its run directory appears), at most
    until the block ends: a fault meant for this test never lands in the next one."""
    count = "ls /opt/vllm-fleet/current/soak/ 2>/dev/null | wc -l"
    before, done = node_exec(sim, node, count), threading.Event()

    def wait_then_act():
        while not done.wait(0.5):
            if node_exec(sim, node, count) != before:
                action()
                return

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=70)


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
    with during_the_next_soak(fleet, "node01", lambda: node_exec(fleet, "node01", wedge)), \
            Traffic(fleet, SERVED, workers=2) as traffic:
        code, output, summary, junit = vllm_fleet(tmp_path / "wedged", "rollout", "-i", str(fleet.inventory),
                                                  "--limit", "canary", *plan, timeout=1200)

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
