# SPDX-License-Identifier: Apache-2.0
"""Run a release's own code as an unprivileged user, never as the root that runs modules.

A release is third-party code (vLLM, torch and their wheels): its Python asked for its cuDNN,
or its `vllm bench serve` run by the soak, would otherwise run with every right on the node,
undoing what the unit's hardening keeps from it. subprocess drops to the user between fork
and exec, with the user's own group and no supplementary groups."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess

# Enough of a traceback's last line to name the error, not a whole sys.path.
MAX_ERROR = 400


class IdentityError(ValueError):
    pass


def as_user(name: str | None) -> dict:
    """subprocess keyword arguments that run a child as ``name`` (nothing for None).

    Raises IdentityError when the user does not exist, or when the caller is not root and
    not already that user (it could not switch)."""
    if not name:
        return {}
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise IdentityError(f"user {name!r} does not exist on this node") from None
    if os.geteuid() == entry.pw_uid:
        return {}
    if os.geteuid() != 0:
        raise IdentityError(f"cannot run as user {name!r}: this runs as uid {os.geteuid()}, not root")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def last_line(text: str, limit: int | None = MAX_ERROR) -> str:
    """The last non-blank line of ``text`` (cut to ``limit``), or 'no output'."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:limit] if lines else "no output"


def run_probe(run, cmd: list, timeout: int, what: str):
    """Run ``cmd`` (a release's code) with ``run``, subprocess.run bound by as_user().

    Returns (stdout, None), or (None, a sentence naming the timeout, the exit status or
    the signal, with the last line of stderr): a failing probe is reported, not raised."""
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{what} timed out after {timeout}s"
    except OSError as exc:
        return None, f"{what} could not run {cmd[0]}: {exc}"
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return None, f"{what} was killed by {name}: {last_line(proc.stderr)}"
    if proc.returncode != 0:
        return None, f"{what} failed (exit status {proc.returncode}): {last_line(proc.stderr)}"
    return proc.stdout, None
