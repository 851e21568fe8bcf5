"""The rollout lock (issue 12, item 5) on a simulated fleet of two nodes: two rollout.yml runs
at once, the second refused at once naming the first while the first rolls the fleet, the
lease gone once it ends; a stale lease refused until the operator names it to break; a live
one never broken. The lease lives next to HAProxy on this host (the LB host, localhost),
at the path the fleet's inventory gives.

Tests run in file order on one fleet (one provisioning)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from tests.fixtures.story import (CUDNN_BLOCKER, EXIT0, FIXED, FIXED_ID, NVFP4, PRE_FIX, node_exec, play,
                                  provisioned_fleet, state)
from tests.integration.playbook import BIN, ROOT

NODES = ["node01", "node02"]
# No soak: the first run only has to outlast the second's refusal; the soak has its own tests.
TARGET = {"release": FIXED, "profile_": NVFP4, "accept": [EXIT0], "vllm_fleet_rollout_soak": False}


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("lock"), f"vf-lock-{os.getpid()}-", len(NODES)) as sim:
        yield sim


def lease_path(sim):
    return sim.directory / "rollout.lock"


def start_rollout(sim, **extra):
    """rollout.yml in the background, as an operator's second terminal would run it."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_NOCOLOR": "1"}
    extra_vars = {"vllm_fleet_release": TARGET["release"], "vllm_fleet_profile": TARGET["profile_"],
                  "vllm_fleet_accepted_risks": TARGET["accept"], "vllm_fleet_rollout_soak": False,
                  "vllm_fleet_report_dir": str(sim.directory / "reports"), **extra}
    return subprocess.Popen([str(BIN / "ansible-playbook"), "-i", str(sim.inventory), "rollout.yml",
                             "-e", json.dumps(extra_vars)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def lease_text(holder, expires, controller="ctl-elsewhere", pid=4242):
    """Another run's lease, as rollout_lock writes one."""
    return json.dumps({"holder": holder, "controller": controller, "pid": pid, "user": "deploy",
                       "started": "2026-01-01T00:00:00+00:00", "expires": expires, "ttl": 3600})


def write_lease(sim, holder, expires, controller="ctl-elsewhere", pid=4242):
    lease_path(sim).write_text(lease_text(holder, expires, controller, pid))
    return lease_path(sim).read_text()


def test_a_second_rollout_is_refused_at_once_naming_the_first_which_proceeds(fleet):
    assert not lease_path(fleet).exists()
    first = start_rollout(fleet)
    try:
        deadline = time.monotonic() + 180
        while not lease_path(fleet).exists():
            assert first.poll() is None, first.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the first run never took the rollout lock"
            time.sleep(0.2)
        lease = json.loads(lease_path(fleet).read_text())
        assert lease["pid"] == first.pid  # ansible-playbook's own pid: what an operator looks for

        began = time.monotonic()
        second = play(fleet, "rollout.yml", **TARGET)
        refused_in = time.monotonic() - began

        assert second.rc != 0
        for word in ("Another rollout holds the rollout lock", str(lease_path(fleet)), f"holder {lease['holder']}",
                     f"controller {lease['controller']}", f"pid {first.pid}", f"taken {lease['started']}",
                     "Nothing was changed"):
            assert word in second.output, (word, second.output[-4000:])
        # Refused before any node was read (the first run's output shows that read, below).
        assert "Read every node of the play, each of which must answer" not in second.output
        assert first.poll() is None, "the first run ended before the second was refused: no concurrency shown"
        after = json.loads(lease_path(fleet).read_text())
        assert (after["holder"], after["started"]) == (lease["holder"], lease["started"])  # the refusal left it alone
        # Every play of the first run renews the lease: the expiry named is the one it had then.
        named = re.search(r"expires (\S+?)\.? ", second.output).group(1)
        assert lease["expires"] <= named <= after["expires"], (named, lease, after)
    finally:
        output = first.communicate(timeout=900)[0]

    assert first.returncode == 0, output[-4000:]
    assert "Read every node of the play, each of which must answer" in output  # what the refused run never reached
    assert not lease_path(fleet).exists()  # released at the end
    for node in NODES:
        assert state(fleet, node)["current"] == FIXED_ID, node  # the first run rolled the fleet
    print(f"second run refused in {refused_in:.1f} s")


def test_a_stale_lease_is_refused_until_named_and_a_live_one_is_never_broken(fleet):
    # Negative control: a live lease (another controller, expiring in the future), named to
    # break, still refuses.
    live = write_lease(fleet, "live-run-1", "2099-01-01T00:00:00+00:00")
    run = play(fleet, "rollout.yml", **TARGET, vllm_fleet_rollout_break_lock="live-run-1")
    assert run.rc != 0 and "holder live-run-1" in run.output and "it is not stale" in run.output, run.output[-3000:]
    assert lease_path(fleet).read_text() == live

    stale = write_lease(fleet, "stale-run-1", "2026-01-01T04:00:00+00:00")
    run = play(fleet, "rollout.yml", **TARGET)
    assert run.rc != 0
    assert "is stale (it expired at 2026-01-01T04:00:00+00:00)" in run.output, run.output[-3000:]
    assert "-e vllm_fleet_rollout_break_lock=stale-run-1" in run.output
    assert lease_path(fleet).read_text() == stale

    run = play(fleet, "rollout.yml", **TARGET, vllm_fleet_rollout_break_lock="stale-run-1")
    assert run.rc == 0, run.output[-4000:]
    assert "Broke the stale rollout lock of stale-run-1" in run.output
    assert not lease_path(fleet).exists()  # the converged re-run took the lock and released it


def test_a_run_that_fails_after_taking_the_lock_releases_it(fleet):
    # cuDNN 9.19 under NVFP4 on sm_120: preflight, the play after the lock was taken, blocks.
    run = play(fleet, "rollout.yml", release=PRE_FIX, profile_=NVFP4, accept=[EXIT0], vllm_fleet_rollout_soak=False)
    assert run.rc != 0 and f"[{CUDNN_BLOCKER}]" in run.output, run.output[-3000:]
    assert "TASK [vllm_fleet.fleet.rollout_node : Take the rollout lock on localhost]" in run.output
    assert "TASK [vllm_fleet.fleet.rollout_node : Release the rollout lock on localhost]" in run.output
    assert not lease_path(fleet).exists()


def test_a_node_that_does_not_answer_once_the_lock_is_taken_releases_it(fleet):
    # The opening play reads the nodes only once it holds the lock. A node that does not answer
    # then is UNREACHABLE, and Ansible runs nothing more on it: the lock goes first.
    before = state(fleet, "node01")
    subprocess.run(["podman", "pause", fleet.prefix + "node02"], check=True, timeout=60)
    try:
        run = play(fleet, "rollout.yml", **TARGET)
    finally:
        subprocess.run(["podman", "unpause", fleet.prefix + "node02"], timeout=60)
    assert run.rc != 0 and "UNREACHABLE" in run.output, run.output[-3000:]
    assert "TASK [vllm_fleet.fleet.rollout_node : Take the rollout lock on localhost]" in run.output
    assert "TASK [vllm_fleet.fleet.rollout_node : Stop at a node that does not answer]" in run.output
    assert not lease_path(fleet).exists()
    assert state(fleet, "node01") == before


def test_a_check_run_leaves_no_lease(fleet):
    run = play(fleet, "rollout.yml", "--check", **TARGET)
    assert "Take the rollout lock on localhost" in run.output, run.output[-3000:]
    assert not lease_path(fleet).exists()


@pytest.mark.parametrize("name, value, words", [
    ("vllm_fleet_rollout_lock_ttl", 30, "vllm_fleet_rollout_lock_ttl: 30 is not a number of seconds >= 60"),
    ("vllm_fleet_rollout_lock_path", "rollout.lock", 'vllm_fleet_rollout_lock_path: "rollout.lock" is not an absolute'),
    ("vllm_fleet_rollout_break_lock", "a b", 'vllm_fleet_rollout_break_lock: "a b" is not a holder id'),
], ids=["ttl", "path", "break"])
def test_bad_lock_settings_are_refused_before_anything_changes(fleet, name, value, words):
    run = play(fleet, "rollout.yml", **TARGET, **{name: value})
    assert run.rc != 0 and words in run.output, run.output[-3000:]
    assert "Take the rollout lock" not in run.output and not lease_path(fleet).exists()


def test_a_lock_host_reached_over_ssh_keeps_the_lease_there(fleet):
    # The lease on a node: the module runs there (the action plugin runs it in the controller's
    # own process only for a lock host with the local connection, as localhost above).
    where = {"vllm_fleet_rollout_lock_host": "node02", "vllm_fleet_rollout_lock_path": "/var/tmp/vf-rollout.lock"}
    lease = lease_text("other-run", "2099-01-01T00:00:00+00:00")
    node_exec(fleet, "node02", f"printf '%s' '{lease}' > /var/tmp/vf-rollout.lock")
    try:
        run = play(fleet, "rollout.yml", **TARGET, **where)
    finally:
        node_exec(fleet, "node02", "rm -f /var/tmp/vf-rollout.lock")
    assert run.rc != 0 and "Another rollout holds the rollout lock /var/tmp/vf-rollout.lock" in run.output, \
        run.output[-3000:]
    assert "other-run" in run.output and not lease_path(fleet).exists()

    run = play(fleet, "rollout.yml", **TARGET, **where)
    assert run.rc == 0, run.output[-3000:]
    assert "Take the rollout lock on node02" in run.output
    assert node_exec(fleet, "node02", "ls /var/tmp/vf-rollout.lock* 2>/dev/null") == ""
