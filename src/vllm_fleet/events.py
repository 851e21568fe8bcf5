"""What a run's ansible-runner events say, per host: a pure function of the event list.

Events are the dicts ansible-runner hands to an event_handler (and writes under
``artifacts/<ident>/job_events/``): ``{"event": ..., "stdout": ..., "created": ...,
"event_data": {"host", "task", "role", "task_action", "res", ...}}``.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path


def _load_terminal_text():
    """The collection's plain-Python terminal_text (the rollout lock escapes lease fields with
    it), from the checkout this package is installed from in editable mode."""
    path = Path(__file__).resolve().parents[2] / "plugins" / "module_utils" / "terminal_text.py"
    spec = importlib.util.spec_from_file_location("vllm_fleet_terminal_text", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


terminal_text = _load_terminal_text()
DEBUG_ACTIONS = {"debug", "ansible.builtin.debug", "ansible.legacy.debug"}
# Ansible's own words for a loop's aggregate result: the items carry the real message.
LOOP_SUMMARIES = {"One or more items failed", "All items completed"}


@dataclass
class HostFacts:
    failed_task: str | None = None  # the last failure not ignored (a later rescue may undo it)
    failed_message: str | None = None
    unreachable_task: str | None = None
    unreachable_message: str | None = None
    duration_s: float = 0.0  # sum of this host's task durations


@dataclass
class RunFacts:
    hosts: dict[str, HostFacts] = field(default_factory=dict)  # in order of first appearance
    stats: dict | None = None  # event_data of playbook_on_stats: ok/changed/dark/failures/...
    output: list[str] = field(default_factory=list)  # text printed outside any task ([ERROR] ...)

    def stat(self, key: str, host: str) -> int:
        return int(((self.stats or {}).get(key) or {}).get(host, 0))


def task_label(data: dict) -> str:
    task = data.get("task") or data.get("task_action") or "?"
    role = data.get("role")
    return f"{role} : {task}" if role else task


def clean(text: str) -> str:
    """Text from a task or a node as the operator's terminal may show it: escape sequences
    (CSI, OSC, DCS, ...) removed, CR made a newline, other controls escaped (\\x07)."""
    return terminal_text.for_terminal(text)


def result_message(res: dict | None) -> str | None:
    """The readable part of a task result: msg, else stderr/stdout of a command; cleaned,
    whatever its type (a node's output may hold any bytes)."""
    if not isinstance(res, dict):
        return None
    parts = []
    for key in ("msg", "stderr", "stdout", "reason"):
        value = res.get(key)
        if value not in (None, "", []):
            if isinstance(value, list):
                parts.append(clean("\n".join(str(v) for v in value)))
            else:
                parts.append(clean(value).rstrip() if isinstance(value, str) else clean(str(value)))
            # A command's own "non-zero return code" says little: add what it printed.
            if key == "msg" and res.get("rc") not in (None, 0) and (res.get("stderr") or res.get("stdout")):
                continue
            break
    return "\n".join(parts) if parts else None


def collect(events: list[dict]) -> RunFacts:
    facts = RunFacts()
    item_failure: dict[str, str] = {}  # host -> message of its last failed loop item
    for event in events:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if kind == "playbook_on_stats":
            facts.stats = {k: dict(data.get(k) or {}) for k in
                           ("ok", "changed", "dark", "failures", "ignored", "rescued", "skipped", "processed")}
            continue
        if not host:
            if kind in ("verbose", "error") and event.get("stdout"):
                facts.output.extend(clean(event["stdout"]).splitlines())
            continue
        if not kind.startswith("runner_"):
            continue
        hf = facts.hosts.setdefault(host, HostFacts())
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            try:
                hf.duration_s += float(data.get("duration") or 0)
            except (TypeError, ValueError):
                pass
        if kind == "runner_item_on_failed" and not data.get("ignore_errors"):
            message = result_message(res)
            if message:
                item_failure[host] = message
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            message = result_message(res)
            if (message is None or message in LOOP_SUMMARIES) and host in item_failure:
                message = item_failure[host]
            hf.failed_task = task_label(data)
            hf.failed_message = message
            item_failure.pop(host, None)
        elif kind == "runner_on_unreachable":
            hf.unreachable_task = task_label(data)
            hf.unreachable_message = result_message(res)
    return facts
