"""What the fault matrix's two files share (docs/FAULTS.md): a rollout under client
traffic, and the checks every fault ends with: the node that met the fault serves its last
known-good release, no more than one batch out of HAProxy at any moment, 0 failed, 0
retried and 0 redispatched client requests (HAProxy's own counters: its retries would hide
a dropped request), and a re-run, with the fault gone, that converges."""
from __future__ import annotations

import json
import threading
import urllib.request
from contextlib import contextmanager

from tests.fixtures.simnode.fleet import SimFleet, Traffic
from tests.fixtures.story import EXIT0, FLEET_VARS, NVFP4, SERVED, clear_reports, node_exec, play, report, state

NODES = ["node01", "node02"]
FAST = {**FLEET_VARS, "vllm_fleet_soak_duration_s": 6, "vllm_fleet_soak_min_duration_s": 3}


def seqs(n: int) -> dict:
    """The NVFP4 profile with another max-num-seqs: a new target on the staged release."""
    return dict(NVFP4, name=f"nvfp4-seqs-{n}", serve_args={**NVFP4["serve_args"], "max-num-seqs": n})


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
