"""Run one playbook through ansible-runner, streaming events to a handler.

ansible-runner only sets the environment and starts ansible-playbook: it does not read
an ansible.cfg in its private data dir, so ANSIBLE_CONFIG points at the project's, and
ANSIBLE_COLLECTIONS_PATH at its collections/ (the checkout is the collection).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Environment values that should not sit in artifacts CI may upload.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH", re.I)


@dataclass
class RunRequest:
    project_dir: Path
    playbook: Path  # absolute
    inventories: list[Path]  # absolute
    private_data_dir: Path  # the run's artifacts
    ident: str
    limit: str | None = None
    extravars: dict = field(default_factory=dict)
    check: bool = False
    vault_files: list[Path] = field(default_factory=list)  # -e @file that ansible-playbook decrypts
    vault_ids: list[str] = field(default_factory=list)
    vault_password_files: list[Path] = field(default_factory=list)


@dataclass
class RunResult:
    rc: int | None
    status: str | None  # successful | failed | timeout | canceled
    artifact_dir: Path | None


def ansible_env(project_dir: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # ansible-playbook of this environment
    path = os.environ.get("PATH", "")
    return {
        "ANSIBLE_CONFIG": str(project_dir / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(project_dir / "collections"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PATH": bin_dir if not path else f"{bin_dir}{os.pathsep}{path}",
    }


def runner_kwargs(request: RunRequest, event_handler: Callable[[dict], bool]) -> dict:
    kwargs = {
        "private_data_dir": str(request.private_data_dir),
        "project_dir": str(request.project_dir),
        "playbook": str(request.playbook),
        # a list: ansible-runner passes each as -i, and never mistakes a path for inline text
        "inventory": [str(p) for p in request.inventories],
        "extravars": request.extravars,
        "envvars": ansible_env(request.project_dir),
        "ident": request.ident,
        "event_handler": event_handler,
        "quiet": True,
    }
    if request.limit:
        kwargs["limit"] = request.limit
    cmdline = ["--check"] if request.check else []
    for vault_id in request.vault_ids:
        cmdline += ["--vault-id", vault_id]
    for path in request.vault_password_files:
        cmdline += ["--vault-password-file", str(path)]
    for path in request.vault_files:
        cmdline += ["-e", f"@{path}"]
    if cmdline:
        kwargs["cmdline"] = " ".join(shlex.quote(word) for word in cmdline)
    return kwargs


def scrub_extravars(private_data_dir: Path) -> None:
    """ansible-runner writes every extra var in plaintext to <private_data_dir>/env/extravars
    and hands ansible-playbook `-e @` that file: remove it after the run, so an API key given
    with -e is not kept with the artifacts CI uploads."""
    for name in ("extravars", "passwords", "ssh_key"):
        try:
            (private_data_dir / "env" / name).unlink()
        except FileNotFoundError:
            pass


def run(request: RunRequest, on_event: Callable[[dict], None]) -> RunResult:
    import ansible_runner  # imported late: `vllm-fleet --help` stays fast

    request.private_data_dir.mkdir(parents=True, exist_ok=True)
    # Only the user who runs vllm-fleet may read what ansible-runner writes there (the extra
    # vars, until scrub_extravars removes them).
    (request.private_data_dir / "env").mkdir(mode=0o700, exist_ok=True)
    scrub_extravars(request.private_data_dir)  # a stale file would send new extra vars inline on argv

    def handler(event: dict) -> bool:
        on_event(event)
        return True  # keep the event in the artifacts too

    # ansible-runner turns SIGINT/SIGTERM into a clean cancel of ansible-playbook, and
    # leaves its handlers installed: put the caller's back afterwards.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = ansible_runner.run(**runner_kwargs(request, handler))
    finally:
        scrub_extravars(request.private_data_dir)
        if threading.current_thread() is threading.main_thread():
            for sig, previous in saved.items():
                signal.signal(sig, previous)
    artifact_dir = Path(result.config.artifact_dir) if getattr(result, "config", None) else None
    if artifact_dir is not None:
        redact_command_env(artifact_dir / "command")
    return RunResult(rc=result.rc, status=result.status, artifact_dir=artifact_dir)


def redact_command_env(path: Path) -> None:
    """ansible-runner records the whole environment in artifacts/<ident>/command; blank the
    values whose names look like credentials before anyone uploads the artifacts."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    env = record.get("env")
    if not isinstance(env, dict):
        return
    record["env"] = {k: ("<redacted>" if _SECRET_NAME.search(k) else v) for k, v in env.items()}
    path.write_text(json.dumps(record))
