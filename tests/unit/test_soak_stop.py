"""soak_stop's logic (plugins/module_utils/soak_stop.py) on real processes: a soak an
interrupted rollout left running is found by its own progress line, stopped with its whole
process group, and given a verdict that says so; what is not such a soak is left alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import soak_stop


def leftover(tmp_path, name: str, *argv: str, verdict: bool = False):
    """A run directory whose progress names a live process started as argv (its own session,
    like Ansible's async wrapper, with a child in its group like the soak's bench)."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                             "'import time; time.sleep(120)']); time.sleep(120)", *argv],
                            start_new_session=True)
    state_dir = tmp_path / name
    state_dir.mkdir()
    (state_dir / "progress.jsonl").write_text(
        json.dumps({"t": time.time(), "pid": 0, "phase": "ready"}) + "\n"
        + json.dumps({"t": time.time(), "pid": proc.pid, "elapsed_s": 31.5}) + "\n")
    if verdict:
        (state_dir / "verdict.json").write_text('{"passed": true}\n')
    return proc, state_dir


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    out = subprocess.run(["ps", "-o", "stat=", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    return any(not stat.startswith("Z") for stat in out)


def test_a_leftover_soak_is_stopped_with_its_group_and_gets_a_verdict(tmp_path):
    proc, state_dir = leftover(tmp_path, "20261204T120000Z-gpu0", "vllm_fleet.fleet.soak")
    try:
        time.sleep(0.3)  # its child started
        found = soak_stop.orphans(str(tmp_path))
        assert found == [{"state_dir": str(state_dir), "pid": proc.pid, "elapsed_s": 31.5}]
        stopped = soak_stop.stop(found[0], timeout=5)
        proc.wait(5)
        assert stopped["signal"] == "SIGTERM"
        assert not group_alive(proc.pid), "the soak's child (its bench) still runs"
        verdict = json.loads((state_dir / "verdict.json").read_text())
        assert verdict["passed"] is False and verdict["stopped"] == "interrupted"
        assert verdict["reasons"] == [soak_stop.STOPPED_REASON]
        assert soak_stop.orphans(str(tmp_path)) == []  # it has a verdict now
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


@pytest.mark.parametrize("case", ["not a soak", "has a verdict"])
def test_what_is_not_a_leftover_soak_is_left_alone(tmp_path, case):
    argv = ("sleeper",) if case == "not a soak" else ("soak",)
    proc, state_dir = leftover(tmp_path, "run-gpu0", *argv, verdict=case == "has a verdict")
    try:
        assert soak_stop.orphans(str(tmp_path)) == []
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(5)


def test_no_soak_directory_finds_nothing(tmp_path):
    assert soak_stop.orphans(str(tmp_path / "current" / "soak")) == []
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "progress.jsonl").write_text(json.dumps({"t": 1, "pid": 2 ** 22 - 1}) + "\n")  # no such process
    assert soak_stop.orphans(str(tmp_path)) == []
