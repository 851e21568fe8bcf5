"""HAProxy reloaded during the canary's soak (docs/FAULTS.md): the fleet's HAProxy runs the
config fleet_lb writes (server-state-file, load-server-state-from-file) and is reloaded the
way its haproxy.service drop-in reloads it, the server state dumped first
(SimFleet.reload_haproxy). On a fleet of two nodes of its own, under client traffic: the
drained canary stays DRAIN and receives no request after the reload, the rollout passes,
and the counters are clean (0 failed, 0 retried, 0 redispatched, over both HAProxy
processes). Negative control: the same reload without the state (a host without the
drop-in) puts the soaking canary back in traffic, and the same check catches it."""
from __future__ import annotations

import os
import time

import pytest

from tests.fixtures.simnode.fleet import SimFleet
from tests.fixtures.story import EXIT0, FIXED, FIXED_ID, NVFP4, provisioned_fleet, report
from tests.integration.faults import FAST, NODES, assert_serves, rollout, seqs
from tests.integration.faults import during_the_next_soak

# A soak long enough to reload HAProxy and watch the drained canary for WATCH_S inside it.
SOAKING = {**FAST, "vllm_fleet_soak_duration_s": 15, "vllm_fleet_soak_min_duration_s": 8}
WATCH_S = 4


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("lb-reload"), f"vf-lbr-{os.getpid()}-", len(NODES),
                           release=FIXED, profile_=NVFP4, accept=[EXIT0], group_vars=SOAKING) as sim:
        yield sim


def reload_and_watch(sim: SimFleet, keep_state: bool, seen: list) -> None:
    """Reload HAProxy, then sample node01 (admin state, sessions since the reload) for WATCH_S."""
    sim.reload_haproxy(keep_state=keep_state)
    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:
        server = sim.lb_servers()["node01"]
        seen.append((server["admin"], server["stot"]))
        time.sleep(0.2)


def drained_node_took_no_traffic(seen: list) -> bool:
    """The check: the canary, drained for its soak, stayed DRAIN over the reload and the new
    HAProxy sent it no request (its session total counts from the reload)."""
    return bool(seen) and all(admin == "DRAIN" and sessions == 0 for admin, sessions in seen)


def test_a_reload_during_the_soak_keeps_the_canary_drained(fleet):
    seen: list = []
    with during_the_next_soak(fleet, "node01", lambda: reload_and_watch(fleet, True, seen)):
        run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=seqs(88))

    assert run.rc == 0, run.output[-4000:]
    assert len(seen) >= WATCH_S * 3, seen  # the reload happened during the soak, and was watched
    assert drained_node_took_no_traffic(seen), seen
    assert report(fleet, "node01")["status"] == "upgraded"
    assert traffic.most_out == 1
    traffic.assert_clean()  # counted over both HAProxy processes
    print("reload during the soak:", traffic.summary())
    assert_serves(fleet, "node01", FIXED_ID, "nvfp4-seqs-88")


def test_negative_control_a_reload_without_the_state_sends_the_soaking_canary_traffic(fleet):
    seen: list = []
    with during_the_next_soak(fleet, "node01", lambda: reload_and_watch(fleet, False, seen)):
        run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=seqs(84))

    assert seen, "the reload never happened during the soak"
    assert not drained_node_took_no_traffic(seen)
    assert any(admin == "READY" for admin, _ in seen) and seen[-1][1] > 0, seen  # back in, and served clients
    # The rollout has no check of its own for this: its soak ran on a node taking client
    # traffic, and passes or fails on what that traffic did to its figures.
    print("reload without the state: rollout rc", run.rc, traffic.summary(), "node01 after the reload:", seen[-1])
