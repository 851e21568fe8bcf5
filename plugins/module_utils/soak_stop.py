# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""Soaks that an interrupted rollout left running: the controller was killed (SIGINT,
SIGKILL) while a node soaked, nothing collected the detached soak, and it goes on loading
the drained node. Found by what the soak itself writes (a run directory with progress but
no verdict, the writer's pid in its last progress line, that pid alive and a soak), stopped
with its whole process group (Ansible's async wrapper, the soak, its `vllm bench serve`),
and given a verdict that says so: the evidence stays readable and no later run takes it
for a soak still under way."""

from __future__ import annotations

import os
import signal
import time

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import (
    PROGRESS_FILE,
    VERDICT_FILE,
    pid_alive,
    read_last_json_line,
    write_json_atomic,
)

STOPPED_REASON = "stopped by a later run: the rollout that started this soak was interrupted before its verdict"


def _is_soak(pid: int) -> bool:
    """The pid still runs the soak module (a recycled pid is some other process)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"soak" in handle.read()
    except OSError:
        return False


def orphans(root: str) -> list[dict]:
    """Each run directory under root whose soak has no verdict and whose writer still runs."""
    found = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return found
    for name in names:
        state_dir = os.path.join(root, name)
        if not os.path.isdir(state_dir) or os.path.exists(os.path.join(state_dir, VERDICT_FILE)):
            continue
        last = read_last_json_line(os.path.join(state_dir, PROGRESS_FILE)) or {}
        pid = last.get("pid")
        if isinstance(pid, int) and pid > 1 and _is_soak(pid):
            found.append({"state_dir": state_dir, "pid": pid, "elapsed_s": last.get("elapsed_s")})
    return found


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie is gone for our purpose)."""
    if not pid_alive(pid):
        return False
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def stop(found: dict, timeout: float = 10.0, now=time.time, sleep=time.sleep) -> dict:
    """SIGTERM the soak's process group, SIGKILL what is left after timeout, write its verdict."""
    pid = found["pid"]
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        group = None
    own = os.getpgid(0)
    target_group = group is not None and group != own
    killed = "SIGTERM"
    if target_group:
        os.killpg(group, signal.SIGTERM)
    elif group is not None:
        os.kill(pid, signal.SIGTERM)
    deadline = now() + timeout
    while _alive(pid) and now() < deadline:
        sleep(0.2)
    if _alive(pid):
        killed = "SIGKILL"
        if target_group:
            os.killpg(group, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    # A soak that caught the signal may have written its own verdict (stopped: interrupted).
    verdict = os.path.join(found["state_dir"], VERDICT_FILE)
    if not os.path.exists(verdict):
        write_json_atomic(verdict, {
            "passed": False, "stopped": "interrupted", "reasons": [STOPPED_REASON],
            "summary": "%s after %s s: %s" % (killed, found.get("elapsed_s"), STOPPED_REASON)})
    return {**found, "signal": killed}
