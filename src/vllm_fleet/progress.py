"""One readable line per runner event that matters, as the run goes.

Shown: play headers; per host, a task that changed, failed or could not reach the host;
retries of an ``until`` loop (a wait that is still waiting); every ``debug`` message
(the roles print summaries and soak progress that way, loop items included); plays that
matched or kept no host. With verbose, also ok, skipped and ignored failures.

    [12:01:02] PLAY Preflight vLLM nodes against the known-issues catalogue
    [12:01:05] node01  msg          preflight : Summarise the node | verdict: pass (...)
    [12:01:09] node02  FAILED       preflight : Fail a node whose ... | preflight blocked ...
                                    [cudnn-sm12x-fusion-matmul-oob] cuDNN < 9.23.1 ...
"""
from __future__ import annotations

import json
from datetime import datetime

from .events import DEBUG_ACTIONS, LOOP_SUMMARIES, clean, result_message, task_label, terminal_text

MAX_LINES = 40  # of one message; the rest is in the artifacts


def clock(created: str | None) -> str:
    """An event's ISO time (UTC, from the runner) as local HH:MM:SS."""
    try:
        return datetime.fromisoformat(created).astimezone().strftime("%H:%M:%S")
    except (TypeError, ValueError):
        return datetime.now().strftime("%H:%M:%S")


def message_lines(msg) -> list[str]:
    if msg is None:
        return []
    if isinstance(msg, list):
        lines = []
        for item in msg:
            lines.extend(message_lines(item) or [""])
        return lines
    if isinstance(msg, dict):
        return [json.dumps(msg, sort_keys=True, default=str)]
    return clean(str(msg)).splitlines() or [""]


class ProgressFormatter:
    def __init__(self, verbose: bool = False):
        self.verbose = verbose
        self.width = 8  # widest host name seen so far

    def _line(self, event: dict, host: str, status: str, label: str, lines: list[str]) -> list[str]:
        self.width = max(self.width, len(host))
        prefix = f"[{clock(event.get('created'))}] {host:<{self.width}} {status:<12} "
        first = f"{prefix}{label}" + (f" | {lines[0]}" if lines else "")
        rest = lines[1:MAX_LINES]
        if len(lines) > MAX_LINES:
            rest.append(f"... ({len(lines) - MAX_LINES} more lines in the run's artifacts)")
        return [first.rstrip()] + [(" " * len(prefix) + line).rstrip() for line in rest]

    def format(self, event: dict) -> list[str]:
        """The lines for one event (often none), each one line of the operator's terminal:
        play, task, host and item names are someone's text too (a templated task name)."""
        return [terminal_text.one_line(line) for line in self._format(event)]

    def _format(self, event: dict) -> list[str]:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        when = clock(event.get("created"))
        if kind == "playbook_on_play_start":
            return [f"[{when}] PLAY {data.get('play') or data.get('name') or ''}".rstrip()]
        if kind == "playbook_on_no_hosts_matched":
            return [f"[{when}] PLAY {data.get('play') or ''}: no hosts matched".rstrip()]
        if kind == "playbook_on_no_hosts_remaining":
            return [f"[{when}] no hosts remaining: the play stopped"]
        host = data.get("host")
        if not host or not kind.startswith("runner_"):
            return []
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        label = task_label(data)
        is_debug = bool({data.get("resolved_action"), data.get("task_action")} & DEBUG_ACTIONS)
        looped = "results" in res
        if kind == "runner_on_unreachable":
            return self._line(event, host, "UNREACHABLE", label, message_lines(result_message(res)))
        if kind in ("runner_on_failed", "runner_item_on_failed"):
            if data.get("ignore_errors"):
                return self._line(event, host, "ignored", label, message_lines(result_message(res))[:1]) \
                    if self.verbose else []
            message = result_message(res)
            if kind == "runner_on_failed" and looped and message in LOOP_SUMMARIES:
                message = message + " (see the failed items above)"
            return self._line(event, host, "FAILED", _item_label(label, data, kind), message_lines(message))
        if kind == "runner_retry":
            attempts, retries = res.get("attempts"), res.get("retries")
            counter = f"attempt {attempts}/{retries}" if attempts and retries else "retrying"
            said = message_lines(result_message(res))[:1]
            return self._line(event, host, "retry", label, [f"{counter}: {said[0]}" if said and said[0] else counter])
        if kind in ("runner_on_ok", "runner_item_on_ok"):
            if is_debug and "msg" in res and not looped:
                return self._line(event, host, "msg", label, message_lines(res["msg"]))
            if kind == "runner_on_ok" and res.get("changed"):
                return self._line(event, host, "changed", label, [])
            if self.verbose and kind == "runner_on_ok":
                return self._line(event, host, "ok", label, [])
            return []
        if kind == "runner_on_skipped" and self.verbose:
            return self._line(event, host, "skipped", label, [])
        return []


def _item_label(label: str, data: dict, kind: str) -> str:
    if kind != "runner_item_on_failed":
        return label
    res = data.get("res") if isinstance(data.get("res"), dict) else {}
    item = res.get("_ansible_item_label", res.get("item"))
    if item is None:
        return label
    shown = item if isinstance(item, str) else json.dumps(item, sort_keys=True, default=str)
    return f"{label} (item {shown[:60]})"
