"""The soak gate: observe one vLLM instance under load, decide a verdict.

Plain Python on purpose (no ``ansible`` import). Two halves, kept apart:

* **decide** -- pure functions over observations, unit-tested without a node:
  ``parse_prometheus``, ``Sample``, the ``Monitor`` state machine (crashes, wedges, failed
  requests), ``aggregate_bench`` / ``judge_performance`` against a baseline, the crash-rate
  statistics (``proof``) and ``verdict``.
* **observe** -- the I/O that feeds them on the node: ``NodeProbe`` (``/health``,
  ``/metrics``, ``systemctl show``, ``journalctl``), ``BenchLoad`` (``vllm bench serve``
  from the release venv, run after run) and ``run_soak``, the loop the ``soak`` module runs.

The soak's files live in ``state_dir``: ``progress.jsonl`` (one line per sample, read by
``soak_status``), ``verdict.json`` (written once, atomically, at the end) and ``bench/``
(each run's summary and log).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import signal
import subprocess
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone

# The Prometheus parser and the notion of progress, shared with the node watchdog; the
# parser stays importable from here (vllm_metrics, older callers).
# pylint: disable-next=unused-import
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import (  # noqa: F401
    SERIES,
    EngineMetrics,
    http_get,
    in_flight,
    incomplete_message,
    int_or_none,
    metric_max,
    metric_sum,
    missing_metrics,
    parse_prometheus,
    parse_systemctl_show,
    progress_marker,
)

SCHEMA_VERSION = 1

# The CUDA failure lines that mean the engine died (the story's crash prints the first or
# the second, then the last two). Regular expressions, searched case-sensitively.
DEFAULT_JOURNAL_PATTERNS = ("illegal memory access", "misaligned address", "EngineDeadError", "CUDA error")

# The reference load of the story: 32 concurrent clients, ~81k tokens in, 256 out.
REFERENCE_CONCURRENCY = 32
REFERENCE_INPUT_LEN = 81000
REFERENCE_OUTPUT_LEN = 256

PROGRESS_FILE = "progress.jsonl"
VERDICT_FILE = "verdict.json"
BENCH_DIR = "bench"

# Performance metrics a baseline may name: direction, how the tolerance applies, default tolerance.
#   higher: observed >= baseline * (1 - tol)   lower: observed <= baseline * (1 + tol)
#   lower_abs (KV cache, a 0-1 fraction): observed <= baseline + tol (tol in fraction points)
PERF_METRICS = {
    "total_token_throughput": ("higher", 0.05),
    "output_throughput": ("higher", 0.05),
    "request_throughput": ("higher", 0.05),
    "mean_tpot_ms": ("lower", 0.10),
    "median_tpot_ms": ("lower", 0.10),
    "p99_tpot_ms": ("lower", 0.20),
    "mean_ttft_ms": ("lower", 0.20),
    "median_ttft_ms": ("lower", 0.20),
    "p99_ttft_ms": ("lower", 0.30),
    "mean_itl_ms": ("lower", 0.10),
    "median_itl_ms": ("lower", 0.10),
    "p99_itl_ms": ("lower", 0.20),
    "kv_cache_peak": ("lower_abs", 0.05),
}
# The least load, in seconds, whose server-side throughput is judged (a short soak whose load
# generator started late has only its ramp-up to show).
MIN_LOAD_S = 5.0
THROUGHPUT_KEYS = ("total_token_throughput", "output_throughput", "request_throughput")
PERF_UNITS = {"total_token_throughput": " tokens/s", "output_throughput": " tokens/s",
              "request_throughput": " req/s"}

# Keys of one `vllm bench serve` result kept in the soak's record (the per-request arrays
# -- input_lens, ttfts, itls, generated_texts, ... -- run to megabytes and are dropped).
BENCH_SUMMARY_KEYS = ("date", "model_id", "num_prompts", "max_concurrency", "duration", "completed", "failed",
                      "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                      "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests")


class SoakConfigError(ValueError):
    """The soak cannot run as configured; the message says what to change."""


def utc_iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- systemd, journal

@dataclass(frozen=True)
class JournalLine:
    time: float  # epoch seconds (journald's realtime stamp)
    text: str


def parse_journal_json(text: str) -> tuple[list[JournalLine], str | None]:
    """``journalctl -o json`` output -> (lines, cursor of the last entry)."""
    lines, cursor = [], None
    for raw in text.splitlines():
        raw = raw.strip()
        if not raw:
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald sends non-UTF-8 messages as byte arrays
            message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode("utf-8", "replace")
        stamp = int_or_none(entry.get("__REALTIME_TIMESTAMP"))
        cursor = entry.get("__CURSOR", cursor)
        if isinstance(message, str):
            lines.append(JournalLine(stamp / 1e6 if stamp else 0.0, message))
    return lines, cursor


# --------------------------------------------------------------------------- samples

@dataclass
class Sample:
    """What one monitor tick saw. ``None`` means "could not be read this tick"."""

    elapsed_s: float
    time: float = 0.0  # epoch seconds
    health: int | None = None  # HTTP status of /health
    health_error: str | None = None  # "refused", "timeout" or another reason when there was no status
    n_restarts: int | None = None
    main_pid: int | None = None
    active_state: str | None = None
    running: float | None = None
    waiting: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    kv_usage: float | None = None
    success_total: float | None = None
    preemptions: float | None = None
    finished: float | None = None  # requests the engine finished (not aborted): vllm_progress
    journal: list = field(default_factory=list)  # JournalLine, new since the last tick

    @classmethod
    def from_observations(cls, elapsed_s: float, *, time: float = 0.0, health: int | None = None,
                          health_error: str | None = None, metrics_text: str | None = None,
                          systemd: dict | None = None, journal=()) -> "Sample":
        sample = cls(elapsed_s, time=time, health=health, health_error=health_error, journal=list(journal))
        if systemd:
            sample.n_restarts = int_or_none(systemd.get("NRestarts"))
            sample.main_pid = int_or_none(systemd.get("MainPID"))
            sample.active_state = systemd.get("ActiveState") or None
        if metrics_text is not None:
            metrics = EngineMetrics.from_text(metrics_text)
            for name in (*SERIES, "finished"):
                setattr(sample, name, getattr(metrics, name))
        return sample

    @property
    def metrics_ok(self) -> bool:
        return self.generation_tokens is not None

    @property
    def in_flight(self) -> float | None:
        return in_flight(self)

    @property
    def progress_marker(self) -> tuple | None:
        """Generated tokens and finished requests (``vllm_progress``: the same notion as
        the node watchdog's)."""
        return progress_marker(self)

    @property
    def missing(self) -> list[str]:
        """The series judging progress needs that this tick's /metrics lacked."""
        return missing_metrics(self)


# --------------------------------------------------------------------------- the monitor

@dataclass
class MonitorConfig:
    wedge_window_s: float = 60.0
    journal_patterns: tuple = DEFAULT_JOURNAL_PATTERNS
    max_failed_requests: int = 0
    tokens_window_s: float = 30.0  # tokens/s in progress lines: average over this window

    def compiled_patterns(self) -> list:
        try:
            return [re.compile(p) for p in self.journal_patterns]
        except re.error as exc:
            raise SoakConfigError(f"journal_patterns: {exc.pattern!r} is not a valid regular expression: {exc}")


class Monitor:
    """Consumes samples (and finished load runs), reports events.

    * crash: NRestarts went up, MainPID changed (or went to 0), the unit left ``active``,
      ``/health`` answered 503 or refused the connection, or a journal line matched one of
      the CUDA patterns. The signals of one engine death arrive over a few ticks (CUDA
      line, 503, exit, restart): they are one crash until the service is healthy again.
    * wedge: requests in flight and no progress (``Sample.progress_marker``: generated
      tokens, finished requests) for ``wedge_window_s`` while ``/health`` says 200 -- or
      while ``/health`` and ``/metrics`` stop answering at all (a hung server). Never when
      idle. In flight rising while nothing is generated (clients retrying) is part of the
      evidence, never progress.
    * metrics_incomplete: ``/metrics`` answers without a series the judgement needs
      (``vllm_progress.missing_metrics``): a wedge cannot be told from idle.
    * failed_requests: the load generator's failed requests exceed ``max_failed_requests``.

    It keeps counting after a failure: the soak stops at the first one (fail fast), a bake
    that watches a node in traffic can keep feeding it.
    """

    def __init__(self, config: MonitorConfig | None = None):
        self.config = config or MonitorConfig()
        self._patterns = self.config.compiled_patterns()
        self.crashes: list[dict] = []
        self.wedges: list[dict] = []
        self.failed_requests = 0
        self.failed_request_errors: list[str] = []
        self.metrics_incomplete: list[str] = []  # the missing series, from the first tick that lacked them
        self.events: list[dict] = []
        self.samples = 0
        self.kv_peak: float | None = None
        self.max_in_flight = 0.0
        self.generated_tokens = 0.0  # generation tokens over the soak, across process restarts
        self.last: Sample | None = None
        self._ref_pid: int | None = None
        self._ref_restarts: int | None = None
        self._down = False  # inside a crash, until healthy again
        self._last_progress_t = 0.0
        self._last_marker = None
        self._flat_in_flight: float | None = None  # in flight when progress was last seen
        self._wedged = False
        self._window: deque = deque()  # (elapsed, cumulative prompt + generation tokens)
        self._tokens_offset = 0.0  # counters restart at 0 with a new process
        self._tokens_prev: float | None = None
        self._gen_prev: float | None = None
        self._tokens_first: tuple[float, float] | None = None

    # -- state
    @property
    def stop_reason(self) -> str | None:
        if self.crashes:
            return "crash"
        if self.wedges:
            return "wedge"
        if self.metrics_incomplete:
            return "metrics_incomplete"
        if self.failed_requests > self.config.max_failed_requests:
            return "failed_requests"
        return None

    @property
    def failed(self) -> bool:
        return self.stop_reason is not None

    def crash_has_journal_evidence(self) -> bool:
        return bool(self.crashes and self.crashes[-1]["journal"])

    # -- observe
    def observe(self, sample: Sample) -> list[dict]:
        """Take one tick; return the events it opened (crashes, wedges)."""
        new: list[dict] = []
        if self.last is None:
            self._ref_pid, self._ref_restarts = sample.main_pid, sample.n_restarts
            self._last_progress_t = sample.elapsed_s
        self.samples += 1
        self._count_tokens(sample)
        if sample.kv_usage is not None:
            self.kv_peak = sample.kv_usage if self.kv_peak is None else max(self.kv_peak, sample.kv_usage)
        if sample.in_flight:
            self.max_in_flight = max(self.max_in_flight, sample.in_flight)

        healthy = self._healthy(sample)
        signals = self._crash_signals(sample)
        matches = self._journal_matches(sample)
        if self._down:
            crash = self.crashes[-1]
            self._attach(crash, signals, matches)
            crash["_unhealthy_seen"] = crash["_unhealthy_seen"] or not healthy
            # Closed when healthy again after being down -- or, for a CUDA line the
            # service outlived, once it stayed healthy for a wedge window.
            if healthy and (crash["_unhealthy_seen"]
                            or sample.elapsed_s - crash["elapsed_s"] >= self.config.wedge_window_s):
                self._down = False
                crash["recovered_elapsed_s"] = round(sample.elapsed_s, 3)
                crash["_recovered_t"] = sample.time
        else:
            # A journal line stamped before the last crash recovered belongs to that crash.
            if self.crashes and self.crashes[-1].get("_recovered_t"):
                late = [m for m in matches if m[0].time and m[0].time <= self.crashes[-1]["_recovered_t"]]
                if late:
                    self._attach(self.crashes[-1], [], late)
                    matches = [m for m in matches if m not in late]
            if signals or matches:
                crash = self._open_crash(sample, signals, matches)
                new.append(crash)
                if healthy and signals and not matches:
                    # died and came back between two ticks (new MainPID, NRestarts up)
                    crash["recovered_elapsed_s"] = round(sample.elapsed_s, 3)
                    crash["_recovered_t"] = sample.time
                else:
                    self._down = True
                    crash["_unhealthy_seen"] = not healthy
        if healthy and not self._down:
            self._ref_pid, self._ref_restarts = sample.main_pid, sample.n_restarts

        if healthy and sample.missing and not self.metrics_incomplete:
            self.metrics_incomplete = sample.missing
            new.append({"kind": "metrics_incomplete", "elapsed_s": round(sample.elapsed_s, 3),
                        "missing": sample.missing, "evidence": incomplete_message(sample.missing)})
        wedge = self._check_wedge(sample)
        if wedge:
            new.append(wedge)
        self.last = sample
        self.events.extend(new)
        return new

    def add_journal(self, lines, sample_time: float = 0.0) -> None:
        """More journal lines after the loop stopped (the evidence grace period)."""
        matches = self._journal_matches(Sample(0.0, time=sample_time, journal=list(lines)))
        if matches and self.crashes:
            self._attach(self.crashes[-1], [], matches)

    def add_bench(self, result: dict, elapsed_s: float) -> list[dict]:
        """A finished load run; returns a failed_requests event when it crosses the limit."""
        failed = int(result.get("failed") or 0)
        if not failed:
            return []
        before = self.failed_requests
        self.failed_requests += failed
        for error in result.get("errors") or ():
            if error and error not in self.failed_request_errors and len(self.failed_request_errors) < 5:
                self.failed_request_errors.append(str(error)[:500])
        limit = self.config.max_failed_requests
        if before <= limit < self.failed_requests:
            event = {"kind": "failed_requests", "elapsed_s": round(elapsed_s, 3), "failed": self.failed_requests,
                     "limit": limit, "evidence": self.failed_request_errors[0] if self.failed_request_errors else ""}
            self.events.append(event)
            return [event]
        return []

    def tokens_per_s(self) -> float | None:
        """Prompt + generated tokens per second over the last ``tokens_window_s`` (server side)."""
        if len(self._window) < 2:
            return None
        (t0, n0), (t1, n1) = self._window[0], self._window[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def server_tokens_per_s(self) -> float | None:
        """Prompt + generated tokens per second while the load ran (server side); None when it
        ran less than MIN_LOAD_S: seconds of ramp-up are no figure to judge."""
        if self._tokens_first is None or not self._window:
            return None
        (t0, n0), (t1, n1) = self._tokens_first, self._window[-1]
        return (n1 - n0) / (t1 - t0) if t1 - t0 >= MIN_LOAD_S else None

    def progress(self) -> dict:
        last = self.last
        rate = self.tokens_per_s()
        return {
            "elapsed_s": round(last.elapsed_s, 1) if last else 0.0,
            "tokens_per_s": round(rate, 1) if rate is not None else None,
            "crashes": len(self.crashes),
            "wedges": len(self.wedges),
            "failed": self.failed_requests,
            "running": last.running if last else None,
            "waiting": last.waiting if last else None,
            "kv_usage": last.kv_usage if last else None,
            "kv_peak": self.kv_peak,
            "health": (last.health if last.health is not None else last.health_error) if last else None,
        }

    # -- internals
    @staticmethod
    def _healthy(sample: Sample) -> bool:
        return sample.health == 200 and sample.active_state in (None, "active") and sample.main_pid != 0

    def _crash_signals(self, sample: Sample) -> list[tuple[str, str]]:
        signals = []
        if sample.health == 503:
            signals.append(("health_503", "/health answered 503: the engine is dead"))
        elif sample.health is not None and sample.health >= 500:
            signals.append(("health_error", f"/health answered {sample.health}"))
        elif sample.health is None and sample.health_error == "refused":
            signals.append(("health_down", "/health refused the connection: no server is listening"))
        if sample.n_restarts is not None and self._ref_restarts is not None and sample.n_restarts > self._ref_restarts:
            signals.append(("restart", f"systemd restarted the unit: NRestarts {self._ref_restarts} -> "
                                       f"{sample.n_restarts}"))
        if sample.main_pid is not None and self._ref_pid is not None and sample.main_pid != self._ref_pid:
            if sample.main_pid == 0:
                signals.append(("main_pid", f"the main process {self._ref_pid} exited (MainPID 0)"))
            else:
                signals.append(("main_pid", f"MainPID changed {self._ref_pid} -> {sample.main_pid}"))
        if sample.active_state is not None and sample.active_state != "active":
            signals.append(("unit_state", f"the unit is {sample.active_state}, not active"))
        return signals

    def _journal_matches(self, sample: Sample) -> list[tuple[JournalLine, str]]:
        out = []
        for line in sample.journal:
            for pattern in self._patterns:
                if pattern.search(line.text):
                    out.append((line, pattern.pattern))
                    break
        return out

    def _open_crash(self, sample: Sample, signals, matches) -> dict:
        crash = {
            "kind": "cuda_error" if matches else signals[0][0],
            "elapsed_s": round(sample.elapsed_s, 3),
            "time": utc_iso(sample.time),
            "detected_at": utc_iso(sample.time),
            "signals": [],
            "evidence": "",
            "journal": [],
            "recovered_elapsed_s": None,
            "_detected_t": sample.time,
            "_recovered_t": None,
            "_unhealthy_seen": False,
        }
        self.crashes.append(crash)
        self._attach(crash, signals, matches)
        return crash

    @staticmethod
    def _attach(crash: dict, signals, matches) -> None:
        for kind, text in signals:
            if not any(s["kind"] == kind for s in crash["signals"]):
                crash["signals"].append({"kind": kind, "detail": text})
        for line, pattern in matches:
            if len(crash["journal"]) < 20 and line.text not in crash["journal"]:
                crash["journal"].append(line.text)
            if not any(s["kind"] == "cuda_error" for s in crash["signals"]):
                crash["signals"].append({"kind": "cuda_error", "detail": f"journal line matches {pattern!r}"})
                if line.time:
                    # when the engine died, by the journal's clock; detection came this much later
                    crash["time"] = utc_iso(line.time)
                    crash["detection_latency_s"] = round(max(0.0, crash["_detected_t"] - line.time), 3)
        # The most telling line: a CUDA error line, else any matched line, else a signal.
        cuda = [text for text in crash["journal"] if "CUDA error" in text]
        crash["evidence"] = (cuda or crash["journal"] or [s["detail"] for s in crash["signals"]] or [""])[0]

    def _check_wedge(self, sample: Sample) -> dict | None:
        healthy = sample.health == 200
        silent = sample.health is None and sample.health_error == "timeout" and not sample.metrics_ok
        marker = sample.progress_marker
        in_flight = sample.in_flight
        if self._down or not (healthy or silent) or (healthy and (marker is None or sample.missing)) \
                or in_flight == 0:
            self._reset_wedge(sample)
            return None
        if marker is not None and marker != self._last_marker:
            self._reset_wedge(sample)
            return None
        flat_for = sample.elapsed_s - self._last_progress_t
        if self._wedged or flat_for < self.config.wedge_window_s:
            return None
        self._wedged = True
        if silent:
            evidence = (f"/health and /metrics have not answered for {flat_for:.0f} s "
                        f"(threshold {self.config.wedge_window_s:g} s): the server hangs")
        else:
            rising = (f" (rising from {self._flat_in_flight:g})" if self._flat_in_flight is not None
                      and in_flight > self._flat_in_flight else "")
            evidence = (f"{in_flight:g} request(s) in flight{rising} and no progress for {flat_for:.0f} s "
                        f"(vllm:generation_tokens_total flat at {sample.generation_tokens:g}, no request finished) "
                        f"while /health answers 200")
        wedge = {
            "kind": "unresponsive" if silent else "no_progress",
            "elapsed_s": round(sample.elapsed_s, 3),
            "since_elapsed_s": round(self._last_progress_t, 3),
            "time": utc_iso(sample.time - flat_for),
            "detected_at": utc_iso(sample.time),
            "flat_for_s": round(flat_for, 3),
            "running": sample.running,
            "waiting": sample.waiting,
            "generation_tokens": sample.generation_tokens,
            "in_flight_at_last_progress": self._flat_in_flight,
            "evidence": evidence,
        }
        self.wedges.append(wedge)
        return wedge

    def _reset_wedge(self, sample: Sample) -> None:
        self._last_progress_t = sample.elapsed_s
        self._last_marker = sample.progress_marker
        self._flat_in_flight = sample.in_flight
        self._wedged = False

    def _count_tokens(self, sample: Sample) -> None:
        if not sample.metrics_ok:
            return
        total = sample.generation_tokens + (sample.prompt_tokens or 0)
        if self._tokens_prev is not None and total < self._tokens_prev:  # a new process: counters from 0
            self._tokens_offset += self._tokens_prev
        self._tokens_prev = total
        gen = sample.generation_tokens
        if self._gen_prev is not None:
            self.generated_tokens += gen - self._gen_prev if gen >= self._gen_prev else gen
        self._gen_prev = gen
        point = (sample.elapsed_s, self._tokens_offset + total)
        # Throughput counts from the last sample before the counters move: the seconds before
        # the load generator sends its first request are not the server's to answer for.
        if self._tokens_first is None or point[1] == self._tokens_first[1]:
            self._tokens_first = point
        self._window.append(point)
        while len(self._window) > 2 and sample.elapsed_s - self._window[1][0] >= self.config.tokens_window_s:
            self._window.popleft()


def public(record: dict) -> dict:
    """A crash or wedge without its internal (underscore) keys."""
    return {k: v for k, v in record.items() if not k.startswith("_")}


# --------------------------------------------------------------------------- load runs

def next_num_prompts(*, concurrency: int, input_len: int, output_len: int, run_s: float,
                     last_result: dict | None = None, baseline: dict | None = None) -> int:
    """How many prompts make one `vllm bench serve` run last about ``run_s`` seconds.

    From the last run's request throughput, else from the baseline's token throughput,
    else two waves. Never fewer than two waves (2 x concurrency): a run of a single
    wave starts and ends every request together and never holds a mixed batch.
    """
    floor = 2 * max(1, concurrency)
    rate = None
    if last_result and (last_result.get("request_throughput") or 0) > 0:
        rate = float(last_result["request_throughput"])
    elif baseline and (baseline.get("total_token_throughput") or 0) > 0:
        rate = float(baseline["total_token_throughput"]) / max(1, input_len + output_len)
    if rate is None:
        return floor
    return max(floor, math.ceil(rate * run_s))


def bench_summary(result: dict) -> dict:
    """The keys worth keeping of one run's result (no per-request arrays)."""
    summary = {k: result[k] for k in BENCH_SUMMARY_KEYS if k in result}
    summary.update({k: v for k, v in result.items() if re.match(r"(mean|median|std|p[0-9.]+)_[a-z]+_ms\Z", k)})
    errors = [e for e in result.get("errors") or () if e]
    if errors:
        counts: dict[str, int] = {}
        for error in errors:
            counts[error[:300]] = counts.get(error[:300], 0) + 1
        summary["errors"] = [f"{n} x {text}" for text, n in sorted(counts.items(), key=lambda kv: -kv[1])[:5]]
    return summary


def aggregate_bench(results: list[dict]) -> dict | None:
    """One set of numbers for all finished runs.

    Throughputs are totals over total duration; means are weighted by completed
    requests; medians and percentiles are the worst run's (conservative: a gate should
    not average a bad run away).
    """
    runs = [r for r in results if (r.get("duration") or 0) > 0]
    if not runs:
        return None
    duration = sum(r["duration"] for r in runs)
    completed = sum(int(r.get("completed") or 0) for r in runs)
    out_tokens = sum(int(r.get("total_output_tokens") or 0) for r in runs)
    in_tokens = sum(int(r.get("total_input_tokens") or 0) for r in runs)
    agg = {
        "runs": len(runs),
        "duration": duration,
        "completed": completed,
        "failed": sum(int(r.get("failed") or 0) for r in runs),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": completed / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
    }
    # What the bench itself reported, duration-weighted across runs: kept beside the totals
    # above (which the gate judges) so that a disagreement shows.
    for key in THROUGHPUT_KEYS:
        reported = [(r[key], r["duration"]) for r in runs if isinstance(r.get(key), (int, float))]
        if reported:
            agg[f"reported_{key}"] = sum(v * d for v, d in reported) / sum(d for _, d in reported)
    keys = {k for r in runs for k in r if re.match(r"(mean|median|p[0-9.]+)_[a-z]+_ms\Z", k)}
    for key in sorted(keys):
        values = [(r[key], int(r.get("completed") or 0)) for r in runs if isinstance(r.get(key), (int, float))]
        if not values:
            continue
        if key.startswith("mean_"):
            weight = sum(n for _, n in values)
            agg[key] = sum(v * n for v, n in values) / weight if weight else sum(v for v, _ in values) / len(values)
        else:
            agg[key] = max(v for v, _ in values)
    return agg


# A tolerance is a fraction of the baseline (KV cache: fraction points); 5 meant as 5% would
# pass everything, and half the baseline or more is no gate.
TOLERANCE_RANGE = (0.0, 0.5)


def _kind(value) -> str:
    """What a value is, in words (Ansible's templated values are tagged subclasses of the plain types)."""
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "a list")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def validate_performance_spec(baseline: dict | None, tolerances: dict | None, *, baseline_name: str = "baseline",
                              tolerances_name: str = "tolerances") -> None:
    """Unknown metric names would silently skip a check, a tolerance out of range passes
    everything: refuse them. The names are what the message calls the two mappings."""
    known = sorted(PERF_METRICS)
    low, high = TOLERANCE_RANGE
    for what, spec in ((baseline_name, {} if baseline is None else baseline),
                       (tolerances_name, {} if tolerances is None else tolerances)):
        if not isinstance(spec, dict):
            raise SoakConfigError(f"{what} must be a mapping of metric name to number, got {_kind(spec)} {spec!r}")
        for key, value in spec.items():
            if key not in PERF_METRICS:
                raise SoakConfigError(f"{what}: unknown metric {key!r}; known: {', '.join(known)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SoakConfigError(f"{what}.{key} must be a number > 0, got {value!r}")
    for key, value in (tolerances or {}).items():
        if not low < value < high:
            raise SoakConfigError(f"{tolerances_name}.{key} is {value!r}: a tolerance is a fraction, "
                                  f"{low:g} < tolerance < {high:g} (0.05 for 5%)")
        if key not in (baseline or {}):
            raise SoakConfigError(f"{tolerances_name}.{key} has no {baseline_name}.{key} to apply to: add the "
                                  "baseline value or remove the tolerance")
    for key, value in (baseline or {}).items():
        if key == "kv_cache_peak" and value > 1:
            raise SoakConfigError(f"{baseline_name}.kv_cache_peak is a 0-1 fraction (vllm:kv_cache_usage_perc), "
                                  f"got {value}: write 0.55 for 55%")


def judge_performance(observed: dict, baseline: dict | None, tolerances: dict | None) -> dict:
    """Each baseline metric: observed vs baseline within tolerance -> passed."""
    metrics = {}
    for key, base in (baseline or {}).items():
        direction, default_tol = PERF_METRICS[key]
        tol = float((tolerances or {}).get(key, default_tol))
        if direction == "higher":
            limit, ok = base * (1 - tol), (lambda v, lim: v >= lim)
        elif direction == "lower":
            limit, ok = base * (1 + tol), (lambda v, lim: v <= lim)
        else:
            limit, ok = base + tol, (lambda v, lim: v <= lim)
        value = observed.get(key)
        entry = {"observed": value, "baseline": base, "tolerance": tol, "limit": round(limit, 6),
                 "direction": "at least" if direction == "higher" else "at most",
                 "passed": None if value is None else bool(ok(value, limit))}
        if value is not None and base:
            entry["change"] = round(value / base - 1, 4) if direction != "lower_abs" else round(value - base, 4)
        metrics[key] = entry
    judged = [m["passed"] for m in metrics.values()]
    return {"metrics": metrics, "passed": all(p is not False for p in judged),
            "unmeasured": sorted(k for k, m in metrics.items() if m["passed"] is None)}


def format_number(value: float) -> str:
    """12160.4 -> "12,160"; small figures keep three significant digits (41.3, 0.62)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def performance_message(key: str, m: dict) -> str:
    """One judged metric in words, e.g. "total_token_throughput: 12,160 tokens/s is 6.9% below
    the baseline 13,060 (tolerance 5%)"; the KV cache in percent and points."""
    if key == "kv_cache_peak":
        points = (m["observed"] - m["baseline"]) * 100
        return (f"{key}: {m['observed'] * 100:.3g}% is {abs(points):.3g} points {'above' if points > 0 else 'below'} "
                f"the baseline {m['baseline'] * 100:.3g}% (tolerance {m['tolerance'] * 100:.3g} points)")
    change = (m["observed"] / m["baseline"] - 1) * 100
    return (f"{key}: {format_number(m['observed'])}{PERF_UNITS.get(key, ' ms')} is {abs(change):.1f}% "
            f"{'above' if change > 0 else 'below'} the baseline {format_number(m['baseline'])} "
            f"(tolerance {m['tolerance'] * 100:.3g}%)")


# --------------------------------------------------------------------------- statistics

def poisson_cdf(k: int, mu: float) -> float:
    """P(X <= k) for X ~ Poisson(mu), summed in log space."""
    if mu <= 0:
        return 1.0
    return min(1.0, sum(math.exp(-mu + i * math.log(mu) - math.lgamma(i + 1)) for i in range(k + 1)))


def poisson_upper_mean(k: int, confidence: float = 0.95) -> float:
    """The one-sided upper confidence bound of a Poisson mean after observing k events.

    Solves P(X <= k; mu) = 1 - confidence by bisection (the exact, "chi-square" bound
    chi2.ppf(confidence, 2k + 2) / 2, without scipy). k = 0 gives -ln(1 - confidence),
    2.996 at 95%: zero crashes in T minutes -> rate < 3/T per minute.
    """
    if not 0 < confidence < 1:
        raise SoakConfigError(f"confidence must be between 0 and 1, got {confidence}")
    if k < 0:
        raise ValueError("k must be >= 0")
    alpha = 1 - confidence
    if k == 0:
        return -math.log(alpha)
    lo, hi = 0.0, float(k + 10)
    while poisson_cdf(k, hi) > alpha:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if poisson_cdf(k, mid) > alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def crash_rate_upper(crashes: int, minutes: float, confidence: float = 0.95) -> float | None:
    """Upper bound on crashes per minute of load; None for a zero-length soak."""
    if minutes <= 0:
        return None
    return poisson_upper_mean(crashes, confidence) / minutes


def required_minutes(target_mtbf_hours: float, confidence: float = 0.95, crashes: int = 0) -> float:
    """Minutes of load with at most ``crashes`` crashes that show MTBF >= target at ``confidence``."""
    return poisson_upper_mean(crashes, confidence) * target_mtbf_hours * 60


def proof(crashes: int, minutes: float, confidence: float = 0.95, target_mtbf_hours: float | None = None,
          failure: str | None = None) -> dict:
    """What a soak of ``minutes`` with ``crashes`` crashes shows about the crash rate.

    ``failure``: why the soak failed. A failed soak proves nothing (a wedged engine does
    not crash, and minutes without load are no evidence): no statement, long_enough false,
    ``not_proved`` says why."""
    pct = f"{confidence * 100:g}%"
    rate = crash_rate_upper(crashes, minutes, confidence)
    mtbf_h = (1 / rate / 60) if rate else None
    out = {
        "confidence": confidence,
        "minutes": round(minutes, 3),
        "crashes": crashes,
        "crash_rate_upper_per_min": rate,
        "mtbf_lower_hours": mtbf_h,
        "target_mtbf_hours": target_mtbf_hours,
        "long_enough": None,
        "required_minutes": None,
        "remaining_minutes": None,
    }
    if rate is None:
        out["statement"] = "The soak ran for no time: it proves nothing about the crash rate."
    else:
        head = (f"Zero crashes in {minutes:.1f} min" if crashes == 0
                else f"{crashes} crash(es) in {minutes:.1f} min")
        out["statement"] = (f"{head} of load: the crash rate is below {rate:.4g}/min "
                            f"(MTBF above {mtbf_h:.3g} h) at {pct} confidence.")
    if failure:
        out.update(statement=None, crash_rate_upper_per_min=None, mtbf_lower_hours=None, long_enough=False,
                   not_proved=f"The soak failed ({failure}): it proves nothing about the crash rate.")
    if target_mtbf_hours:
        need = required_minutes(target_mtbf_hours, confidence, 0)
        out["required_minutes"] = math.ceil(need)
        out["remaining_minutes"] = max(0, math.ceil(need - minutes))
        out["long_enough"] = bool(crashes == 0 and minutes >= need and not failure)
        if failure:
            out["target_statement"] = (f"A failed soak cannot show MTBF >= {target_mtbf_hours:g} h; after the fix, "
                                       f"{out['required_minutes']} min without a crash or a wedge would at {pct}.")
        elif crashes:
            out["target_statement"] = (f"A soak that crashed cannot show MTBF >= {target_mtbf_hours:g} h; after the "
                                       f"fix, {out['required_minutes']} min without a crash would at {pct}.")
        elif out["long_enough"]:
            out["target_statement"] = (f"Long enough: {minutes:.1f} min without a crash shows MTBF >= "
                                       f"{target_mtbf_hours:g} h at {pct} (needs {out['required_minutes']} min).")
        else:
            out["target_statement"] = (f"Not long enough for MTBF >= {target_mtbf_hours:g} h at {pct}: that needs "
                                       f"{out['required_minutes']} min without a crash "
                                       f"({out['remaining_minutes']} min more than this soak).")
    return out


# --------------------------------------------------------------------------- verdict

def verdict(monitor: Monitor, *, elapsed_s: float, duration_s: float, min_duration_s: float,
            bench_results: list[dict], baseline: dict | None = None, tolerances: dict | None = None,
            target_mtbf_hours: float | None = None, confidence: float = 0.95, load_error: str | None = None,
            stopped: str = "completed", shape: dict | None = None, extra: dict | None = None) -> dict:
    """The soak's verdict: passed, one sentence per reason, performance, and what it proved."""
    reasons: list[str] = []
    for crash in monitor.crashes:
        reasons.append(f"The engine crashed {crash['elapsed_s']:.1f} s into the soak ({crash['kind']}): "
                       f"{crash['evidence']}")
    for wedge in monitor.wedges:
        reasons.append(f"The engine wedged {wedge['since_elapsed_s']:.1f} s into the soak: {wedge['evidence']}.")
    broke = bool(monitor.crashes or monitor.wedges)
    if monitor.metrics_incomplete and not broke:
        reasons.append(incomplete_message(monitor.metrics_incomplete) + ".")
    limit = monitor.config.max_failed_requests
    if monitor.failed_requests > limit and not broke:  # failures during a crash are its consequence
        first = f" (first error: {monitor.failed_request_errors[0]})" if monitor.failed_request_errors else ""
        reasons.append(f"{monitor.failed_requests} request(s) failed under load, more than the {limit} allowed"
                       f"{first}.")
    if stopped == "interrupted":
        reasons.append(f"The soak was interrupted after {elapsed_s:.0f} s before reaching a verdict.")
    if load_error and not broke:
        reasons.append(f"The load could not run: {load_error}")

    agg = aggregate_bench(bench_results)
    server_tps = monitor.server_tokens_per_s()
    observed: dict = {}
    source = None
    if agg:
        source = "bench"
        observed.update({k: v for k, v in agg.items() if k in PERF_METRICS})
    elif server_tps is not None:
        source = "metrics"  # no load run finished: the server's own counters
        observed["total_token_throughput"] = server_tps
    if monitor.kv_peak is not None:
        observed["kv_cache_peak"] = monitor.kv_peak
    performance = judge_performance(observed, baseline, tolerances)
    performance["source"] = source
    if not reasons:
        for key, m in performance["metrics"].items():
            if m["passed"] is False:
                reasons.append(performance_message(key, m) + ".")
        if elapsed_s < min_duration_s:
            reasons.append(f"The soak ran {elapsed_s:.0f} s, less than the minimum of {min_duration_s:.0f} s.")
        if monitor.samples and monitor.max_in_flight == 0 and monitor.generated_tokens <= 0:
            reasons.append("The server saw no request during the soak: the load never reached it "
                           "(check base_url, model and the load generator's log under bench/).")
    passed = not reasons
    # Why it failed, in one word where there is one (crash, wedge, ...), else its first reason.
    failure = None if passed else (monitor.stop_reason or (stopped if stopped != "completed" else None)
                                   or reasons[0].rstrip("."))
    proved = proof(len(monitor.crashes), elapsed_s / 60, confidence, target_mtbf_hours, failure=failure)
    throughput = {"gate_used": source and ("bench_totals" if source == "bench" else "server_metrics"),
                  "recomputed": observed.get("total_token_throughput"),
                  "reported": (agg or {}).get("reported_total_token_throughput")}
    notes = []
    if proved.get("not_proved"):
        notes.append(proved["not_proved"])
    if proved.get("target_statement"):
        notes.append(proved["target_statement"])
    if performance["unmeasured"]:
        notes.append(f"Not measured, so not judged: {', '.join(performance['unmeasured'])}.")
    if not baseline:
        notes.append("No baseline given: performance was recorded, not judged.")
    if source == "metrics":
        notes.append("No load run finished within the soak: throughput is the server's own count from /metrics.")
    elif source == "bench":
        reported = throughput["reported"]
        notes.append(f"The gate judged throughput recomputed from the load runs' token totals over their duration "
                     f"({format_number(throughput['recomputed'])} tokens/s); the bench reported "
                     + (f"{format_number(reported)} tokens/s." if reported is not None
                        else "no total_token_throughput."))
    summary = (f"Soak passed: {proved['statement']}" if passed
               else f"Soak failed after {elapsed_s:.1f} s: {reasons[0]}")
    out = {
        "schema_version": SCHEMA_VERSION,
        "passed": passed,
        "summary": summary,
        "reasons": reasons,
        "notes": notes,
        "stopped": stopped,
        "duration_s": round(elapsed_s, 3),
        "planned_duration_s": duration_s,
        "min_duration_s": min_duration_s,
        "crashes": [public(c) for c in monitor.crashes],
        "wedges": [public(w) for w in monitor.wedges],
        "failed_requests": monitor.failed_requests,
        "failed_request_errors": monitor.failed_request_errors,
        "performance": performance,
        "kv_cache_peak": monitor.kv_peak,
        "tokens_per_s": (agg or {}).get("total_token_throughput", server_tps),
        "bench_tokens_per_s": throughput["reported"],
        "server_tokens_per_s": server_tps,
        "throughput": throughput,
        "load": {"shape": shape or {}, "runs": len(bench_results), "aggregate": agg},
        "proof": proved,
    }
    out.update(extra or {})
    return out


# --------------------------------------------------------------------------- status files

def read_last_json_line(path: str, max_bytes: int = 65536) -> dict | None:
    """The last complete JSON line of a file (tolerates a line being written right now)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            tail = handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _pid_alive(pid) -> bool | None:
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_status(state_dir: str, now: float | None = None) -> dict:
    """What soak_status reports: the last progress line, and the verdict once written."""
    now = time.time() if now is None else now
    progress_path = os.path.join(state_dir, PROGRESS_FILE)
    verdict_path = os.path.join(state_dir, VERDICT_FILE)
    last = read_last_json_line(progress_path)
    result = {"state_dir": state_dir, "started": last is not None, "done": False, "verdict": None,
              "passed": None, "running": None, "age_s": None, "progress": None}
    if last is not None:
        result["progress"] = {k: last.get(k) for k in ("elapsed_s", "tokens_per_s", "crashes", "wedges", "failed",
                                                       "phase", "running", "waiting", "kv_usage", "kv_peak",
                                                       "health", "bench_runs", "duration_s")}
        result["age_s"] = round(now - last["t"], 1) if isinstance(last.get("t"), (int, float)) else None
        result["running"] = _pid_alive(last.get("pid"))
    if os.path.exists(verdict_path):
        with open(verdict_path, encoding="utf-8") as handle:
            result["verdict"] = json.load(handle)
        result["done"] = True
        result["passed"] = result["verdict"].get("passed")
    return result


# --------------------------------------------------------------------------- observe: the node

@dataclass
class SoakConfig:
    unit: str
    state_dir: str
    duration_s: float
    venv: str | None = None
    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None
    served_model_name: str | None = None
    tokenizer: str | None = None
    min_duration_s: float = 0.0
    concurrency: int = REFERENCE_CONCURRENCY
    input_len: int = REFERENCE_INPUT_LEN
    output_len: int = REFERENCE_OUTPUT_LEN
    num_prompts: int | None = None
    run_s: float = 60.0
    bench_args: list = field(default_factory=list)
    sample_interval_s: float = 2.0
    wedge_window_s: float = 60.0
    evidence_grace_s: float = 5.0
    ready_timeout_s: float = 120.0
    http_timeout_s: float = 5.0
    baseline: dict = field(default_factory=dict)
    tolerances: dict = field(default_factory=dict)
    max_failed_requests: int = 0
    target_mtbf_hours: float | None = None
    confidence: float = 0.95
    journal_patterns: list = field(default_factory=lambda: list(DEFAULT_JOURNAL_PATTERNS))
    api_key: str | None = None

    def validate(self) -> None:
        if not self.unit:
            raise SoakConfigError("unit is empty: name the serving unit, e.g. vllm@gpu0")
        if self.duration_s <= 0:
            raise SoakConfigError(f"duration_s must be > 0, got {self.duration_s}")
        if self.min_duration_s > self.duration_s:
            raise SoakConfigError(f"duration_s ({self.duration_s:g}) is shorter than min_duration_s "
                                  f"({self.min_duration_s:g}): such a soak could never pass; raise duration_s")
        for name in ("concurrency", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise SoakConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise SoakConfigError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.sample_interval_s <= 0 or self.sample_interval_s > 10:
            raise SoakConfigError(f"sample_interval_s must be in (0, 10] (the gate looks at least every few "
                                  f"seconds), got {self.sample_interval_s}")
        if self.wedge_window_s < 2 * self.sample_interval_s:
            raise SoakConfigError(f"wedge_window_s ({self.wedge_window_s:g}) must span at least two samples "
                                  f"(2 x sample_interval_s = {2 * self.sample_interval_s:g})")
        if not self.base_url.startswith(("http://", "https://")):
            raise SoakConfigError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not 0 < self.confidence < 1:
            raise SoakConfigError(f"confidence must be between 0 and 1 (0.95 for 95%), got {self.confidence}")
        if self.target_mtbf_hours is not None and self.target_mtbf_hours <= 0:
            raise SoakConfigError(f"target_mtbf_hours must be > 0, got {self.target_mtbf_hours}")
        validate_performance_spec(self.baseline, self.tolerances)
        MonitorConfig(journal_patterns=tuple(self.journal_patterns)).compiled_patterns()

    @property
    def vllm_bin(self) -> str | None:
        return os.path.join(self.venv, "bin", "vllm") if self.venv else None

    @property
    def shape(self) -> dict:
        return {"concurrency": self.concurrency, "input_len": self.input_len, "output_len": self.output_len}

    def monitor_config(self) -> MonitorConfig:
        return MonitorConfig(wedge_window_s=self.wedge_window_s, journal_patterns=tuple(self.journal_patterns),
                             max_failed_requests=self.max_failed_requests)


def bench_command(cfg: SoakConfig, num_prompts: int, seed: int, result_dir: str, result_file: str) -> list[str]:
    """``<venv>/bin/vllm bench serve ...`` for one run (the key goes in the env, never argv)."""
    cmd = [cfg.vllm_bin or "vllm", "bench", "serve", "--backend", "vllm", "--base-url", cfg.base_url.rstrip("/"),
           "--endpoint", "/v1/completions", "--dataset-name", "random",
           "--random-input-len", str(cfg.input_len), "--random-output-len", str(cfg.output_len),
           "--num-prompts", str(num_prompts), "--max-concurrency", str(cfg.concurrency), "--ignore-eos",
           # a new seed every run: the same prompts again would be served from the prefix cache
           "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", result_dir, "--result-filename", result_file, "--disable-tqdm"]
    if cfg.model:
        cmd += ["--model", cfg.model]
    if cfg.served_model_name:
        cmd += ["--served-model-name", cfg.served_model_name]
    if cfg.tokenizer:
        cmd += ["--tokenizer", cfg.tokenizer]
    return cmd + [str(a) for a in cfg.bench_args]


class NodeProbe:
    """Reads the instance: /health, /metrics, systemctl show, the unit's journal (by cursor)."""

    def __init__(self, cfg: SoakConfig, run=subprocess.run):
        self.cfg = cfg
        self._run = run
        # Loopback probes must not go through an HTTP proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._cursor: str | None = None
        self._since: float | None = None
        self.cpu_children_s = 0.0  # CPU of systemctl/journalctl children

    def _command(self, argv: list[str], timeout: float = 10) -> str:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            proc = self._run(argv, capture_output=True, text=True, timeout=timeout, errors="replace", check=False)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        finally:
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            self.cpu_children_s += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return proc.stdout if proc.returncode == 0 else ""

    def systemd(self) -> dict:
        return parse_systemctl_show(self._command(
            ["systemctl", "show", self.cfg.unit, "-p", "LoadState", "-p", "ActiveState", "-p", "SubState",
             "-p", "MainPID", "-p", "NRestarts"]))

    def http_get(self, path: str) -> tuple[int | None, str | None, str | None]:
        """(status, body, error) where error is refused / timeout / another reason."""
        return http_get(self._opener, self.cfg.base_url.rstrip("/") + path, self.cfg.http_timeout_s)

    def start_journal(self, since: float) -> None:
        """Read only what the unit logs from now on: the cursor of its latest entry."""
        self._since = since
        _, self._cursor = parse_journal_json(self._command(
            ["journalctl", "-u", self.cfg.unit, "-o", "json", "-n", "1", "--no-pager", "-q"]))

    def journal(self) -> list[JournalLine]:
        argv = ["journalctl", "-u", self.cfg.unit, "-o", "json", "--no-pager", "-q"]
        if self._cursor:
            argv += ["--after-cursor", self._cursor]
        else:
            argv += ["--since", f"@{int(self._since or time.time())}"]
        lines, cursor = parse_journal_json(self._command(argv, timeout=20))
        self._cursor = cursor or self._cursor
        return lines

    def sample(self, elapsed_s: float) -> Sample:
        now = time.time()
        health, _, health_error = self.http_get("/health")
        status, metrics_text, _ = self.http_get("/metrics")
        return Sample.from_observations(
            elapsed_s, time=now, health=health, health_error=health_error,
            metrics_text=metrics_text if status == 200 else None, systemd=self.systemd(), journal=self.journal())


class BenchLoad:
    """``vllm bench serve`` run after run until stopped; each run's summary kept."""

    def __init__(self, cfg: SoakConfig, state_dir: str, popen=subprocess.Popen):
        self.cfg = cfg
        self.dir = os.path.join(state_dir, BENCH_DIR)
        self._popen = popen
        self.proc = None
        self.index = 0
        self.results: list[dict] = []
        self.errors: list[str] = []
        self.consecutive_errors = 0
        self.seed_base = int(time.time()) % 100000
        self._log = None
        self._current: tuple[str, str] | None = None

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        no_proxy = ",".join(filter(None, [env.get("no_proxy") or env.get("NO_PROXY"), "127.0.0.1,localhost,::1"]))
        env["no_proxy"] = env["NO_PROXY"] = no_proxy
        if self.cfg.api_key:
            env["OPENAI_API_KEY"] = self.cfg.api_key
        return env

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        self.index += 1
        name = f"run-{self.index:03d}"
        n = self.cfg.num_prompts or next_num_prompts(
            concurrency=self.cfg.concurrency, input_len=self.cfg.input_len, output_len=self.cfg.output_len,
            run_s=self.cfg.run_s, last_result=self.results[-1] if self.results else None, baseline=self.cfg.baseline)
        cmd = bench_command(self.cfg, n, self.seed_base + self.index, self.dir, f"{name}.raw.json")
        self._log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        self._current = (name, os.path.join(self.dir, f"{name}.raw.json"))
        try:
            self.proc = self._popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env(), close_fds=True)
        except OSError as exc:
            self._log.close()
            self.proc = None
            self._fail(f"cannot start {cmd[0]}: {exc}")

    def poll(self) -> dict | None:
        """The summary of a run that just finished (and saved), else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        self.proc = None
        self._log.close()
        name, raw = self._current
        try:
            with open(raw, encoding="utf-8") as handle:
                result = json.load(handle)
        except (OSError, ValueError):
            result = None
        if rc != 0 or result is None:
            self._fail(f"vllm bench serve exited {rc} without a result; last output: "
                       f"{self.log_tail(name)}")
            return None
        summary = bench_summary(result)
        summary["run"] = name
        with open(os.path.join(self.dir, f"{name}.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
        os.unlink(raw)
        self.results.append(summary)
        self.consecutive_errors = 0
        return {**summary, "errors": result.get("errors") and [e for e in result["errors"] if e]}

    def _fail(self, message: str) -> None:
        self.errors.append(message)
        self.consecutive_errors += 1

    def log_tail(self, name: str, lines: int = 6) -> str:
        try:
            with open(os.path.join(self.dir, f"{name}.log"), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 4000))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(empty)"

    @property
    def running(self) -> bool:
        return self.proc is not None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._log:
            self._log.close()


class ProgressWriter:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, PROGRESS_FILE)
        self._handle = open(self.path, "a", encoding="utf-8")

    def write(self, line: dict) -> None:
        self._handle.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)


class SoakError(RuntimeError):
    """The soak could not start (unit missing, never ready, state_dir reused)."""


def prepare_state_dir(state_dir: str) -> None:
    for name in (VERDICT_FILE, PROGRESS_FILE):
        if os.path.exists(os.path.join(state_dir, name)):
            raise SoakError(f"{state_dir} already holds the {name} of an earlier soak: give each soak its own "
                            "state_dir (the role uses <release>/soak/<run>) or remove the old one")
    os.makedirs(state_dir, mode=0o750, exist_ok=True)


def run_soak(cfg: SoakConfig, *, probe: NodeProbe | None = None, load: BenchLoad | None = None,
             clock=time.monotonic, sleep=time.sleep, wall=time.time, should_stop=lambda: False) -> dict:
    """Soak one instance and return the verdict (also written to ``state_dir/verdict.json``).

    Waits until ``/health`` is 200 and the unit active, starts the load, samples every
    ``sample_interval_s`` and stops at the first crash, wedge or too many failed requests
    (fail fast), at ``duration_s``, or when ``should_stop()`` (a signal) says so.
    """
    cfg.validate()
    prepare_state_dir(cfg.state_dir)
    probe = probe or NodeProbe(cfg)
    cpu0 = time.process_time()
    progress = ProgressWriter(cfg.state_dir)
    pid = os.getpid()

    def write_progress(phase, elapsed, monitor=None, extra=None):
        data = {"t": round(wall(), 3), "pid": pid, "phase": phase, "duration_s": cfg.duration_s}
        if monitor:
            data.update(monitor.progress())
            data["bench_runs"] = len(load.results)
        data["elapsed_s"] = round(elapsed, 1)
        data.update(extra or {})
        progress.write(data)

    try:
        state = probe.systemd()
        if state.get("LoadState") != "loaded":
            raise SoakError(f"unit {cfg.unit} is not loaded (LoadState={state.get('LoadState') or 'unknown'}): "
                            "install and start the serving unit (vllm_service role) before the soak")
        if load is None and not os.access(cfg.vllm_bin or "", os.X_OK):
            raise SoakError(f"{cfg.vllm_bin} is not an executable: venv must be the release venv that has vllm "
                            "installed (the load is its `vllm bench serve`)")
        ready_start = clock()
        while True:
            health, _, error = probe.http_get("/health")
            state = probe.systemd()
            if health == 200 and state.get("ActiveState") == "active":
                break
            waited = clock() - ready_start
            if waited >= cfg.ready_timeout_s or should_stop():
                raise SoakError(f"{cfg.unit} was not ready after {waited:.0f} s (/health: {health or error}, "
                                f"ActiveState {state.get('ActiveState')}): read `journalctl -u {cfg.unit}`, and "
                                "wait for readiness before soaking or raise ready_timeout_s")
            write_progress("waiting_ready", 0.0, extra={"health": health or error})
            sleep(min(1.0, cfg.sample_interval_s))

        load = load or BenchLoad(cfg, cfg.state_dir)
        monitor = Monitor(cfg.monitor_config())
        start, start_wall = clock(), wall()
        probe.start_journal(start_wall)
        load.start()
        stopped, load_error, elapsed = "completed", None, 0.0
        tick = start
        while True:
            elapsed = clock() - start
            monitor.observe(probe.sample(elapsed))
            finished = load.poll()
            if finished is not None:
                monitor.add_bench(finished, elapsed)
            elif not load.running and load.consecutive_errors >= 2:
                load_error = load.errors[-1]  # twice in a row: not a fluke
            write_progress("soak", elapsed, monitor)
            if monitor.failed:
                stopped = monitor.stop_reason
                break
            if load_error:
                stopped = "load_error"
                break
            if should_stop():
                stopped = "interrupted"
                break
            if elapsed >= cfg.duration_s:
                break
            if not load.running:
                load.start()
            tick += cfg.sample_interval_s
            now = clock()
            if tick < now:  # a slow tick: do not burst to catch up
                tick = now
            sleep(max(0.0, min(tick, start + cfg.duration_s) - now))
        load.stop()
        # The signal that stopped the soak (a 503) can come a moment before the CUDA line
        # reaches the journal: give the evidence a short grace to arrive.
        if monitor.crashes:
            grace_end = clock() + cfg.evidence_grace_s
            while not monitor.crash_has_journal_evidence() and clock() < grace_end:
                sleep(0.25)
                monitor.add_journal(probe.journal(), wall())
            sleep(0.25)  # and the lines logged right after it (EngineDeadError follows the CUDA error)
            monitor.add_journal(probe.journal(), wall())
        cpu_self = time.process_time() - cpu0
        result = verdict(
            monitor, elapsed_s=elapsed, duration_s=cfg.duration_s, min_duration_s=cfg.min_duration_s,
            bench_results=load.results, baseline=cfg.baseline, tolerances=cfg.tolerances,
            target_mtbf_hours=cfg.target_mtbf_hours, confidence=cfg.confidence, load_error=load_error,
            stopped=stopped, shape=cfg.shape,
            extra={
                "unit": cfg.unit,
                "base_url": cfg.base_url,
                "venv": cfg.venv,
                "model": cfg.model,
                "started_at": utc_iso(start_wall),
                "finished_at": utc_iso(wall()),
                "monitor": {
                    "samples": monitor.samples,
                    "sample_interval_s": cfg.sample_interval_s,
                    "wedge_window_s": cfg.wedge_window_s,
                    "journal_patterns": list(cfg.journal_patterns),
                    "cpu_self_s": round(cpu_self, 3),
                    "cpu_probes_s": round(probe.cpu_children_s, 3),
                    "cpu_percent_of_one_core": round(100 * (cpu_self + probe.cpu_children_s) / max(elapsed, 1e-9),
                                                     2),
                },
                "load_errors": load.errors[-3:],
            })
        write_json_atomic(os.path.join(cfg.state_dir, VERDICT_FILE), result)
        write_progress("done", elapsed, monitor, {"passed": result["passed"]})
        return result
    except BaseException:
        if load is not None:
            load.stop()
        raise
    finally:
        progress.close()
