"""The soak gate's monitor: what one tick saw (``Sample``, the unit's journal) and the state
machine that tells a crash, a wedge or failed requests from a healthy engine (``Monitor``).

Pure functions over observations (no I/O, no ``ansible`` import); ``soak.NodeProbe`` feeds
them on the node.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import SoakConfigError
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import (
    EngineMetrics,
    incomplete_message,
    int_or_none,
)

# The CUDA failure lines that mean the engine died (the story's crash prints the first or
# the second, then the last two). Regular expressions, searched case-sensitively.
DEFAULT_JOURNAL_PATTERNS = ("illegal memory access", "misaligned address", "EngineDeadError", "CUDA error")

# The least load, in seconds, whose server-side throughput is judged (a short soak whose load
# generator started late has only its ramp-up to show).
MIN_LOAD_S = 5.0

# A soak proves its load by the server's own counters, over the samples from the first one
# that saw load (requests in flight or tokens generated) to the end:
# * tokens generated (vllm:generation_tokens_total rose since the sample before) in at least
#   LOAD_MIN_FRACTION of them. Half, not all: between two load runs the bench starts again
#   (about 9 s for the real one) and the last requests of a run drain;
# * the configured concurrency running: vllm:num_requests_running reached at least
#   CONCURRENCY_FRACTION of it (rounded up). 75%, not 100%: a sample can fall between one
#   request finishing and the next one scheduled, and a long prompt waits for its first chunk of
#   prefill before it counts as running. The peak, not a share of the samples: each run's start
#   (the bench's process, about 9 s for the real one) and drain fall between samples at low
#   concurrency, and in a short soak (runs of a few seconds) they are most of them; a server
#   whose max-num-seqs or KV cache is below the load never reaches it. How many samples were at
#   it is reported beside the peak.
LOAD_MIN_FRACTION = 0.5
CONCURRENCY_FRACTION = 0.75


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
    metrics: EngineMetrics = field(default_factory=EngineMetrics)  # this tick's /metrics; all None: not read
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
            sample.metrics = EngineMetrics.from_text(metrics_text)
        return sample

    @property
    def metrics_ok(self) -> bool:
        return self.metrics.generation_tokens is not None


# --------------------------------------------------------------------------- the monitor

@dataclass
class MonitorConfig:
    wedge_window_s: float = 60.0
    journal_patterns: tuple = DEFAULT_JOURNAL_PATTERNS
    max_failed_requests: int = 0
    tokens_window_s: float = 30.0  # tokens/s in progress lines: average over this window
    concurrency: int | None = None  # the load's clients: judged against vllm:num_requests_running

    @property
    def concurrency_threshold(self) -> int | None:
        return math.ceil(CONCURRENCY_FRACTION * self.concurrency) if self.concurrency else None

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
    * wedge: requests in flight and no progress (``EngineMetrics.progress_marker``: generated
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
        # The load as the server saw it (see LOAD_MIN_FRACTION), from the first sample with load.
        self.metrics_samples = 0  # samples whose /metrics had the vllm:* series
        self.load_arrived_s: float | None = None
        self.load_samples = 0
        self.generating_samples = 0
        self.busy_samples = 0  # some request running
        self.concurrent_samples = 0  # at least the concurrency threshold running
        self.peak_running = 0.0

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
        self._count_load(sample, self._count_tokens(sample))
        kv = sample.metrics.kv_usage
        if kv is not None:
            self.kv_peak = kv if self.kv_peak is None else max(self.kv_peak, kv)

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

        if healthy and sample.metrics.missing and not self.metrics_incomplete:
            self.metrics_incomplete = sample.metrics.missing
            new.append({"kind": "metrics_incomplete", "elapsed_s": round(sample.elapsed_s, 3),
                        "missing": sample.metrics.missing, "evidence": incomplete_message(sample.metrics.missing)})
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
            "running": last.metrics.running if last else None,
            "waiting": last.metrics.waiting if last else None,
            "kv_usage": last.metrics.kv_usage if last else None,
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
        marker = sample.metrics.progress_marker
        in_flight = sample.metrics.in_flight
        if self._down or not (healthy or silent) or (healthy and (marker is None or sample.metrics.missing)) \
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
                        f"(vllm:generation_tokens_total flat at {sample.metrics.generation_tokens:g}, "
                        "no request finished) "
                        f"while /health answers 200")
        wedge = {
            "kind": "unresponsive" if silent else "no_progress",
            "elapsed_s": round(sample.elapsed_s, 3),
            "since_elapsed_s": round(self._last_progress_t, 3),
            "time": utc_iso(sample.time - flat_for),
            "detected_at": utc_iso(sample.time),
            "flat_for_s": round(flat_for, 3),
            "running": sample.metrics.running,
            "waiting": sample.metrics.waiting,
            "generation_tokens": sample.metrics.generation_tokens,
            "in_flight_at_last_progress": self._flat_in_flight,
            "evidence": evidence,
        }
        self.wedges.append(wedge)
        return wedge

    def _reset_wedge(self, sample: Sample) -> None:
        self._last_progress_t = sample.elapsed_s
        self._last_marker = sample.metrics.progress_marker
        self._flat_in_flight = sample.metrics.in_flight
        self._wedged = False

    def _count_load(self, sample: Sample, generated: float) -> None:
        metrics = sample.metrics
        if not sample.metrics_ok:
            return
        self.metrics_samples += 1
        if self.load_arrived_s is None:
            if generated <= 0 and not metrics.in_flight:
                return
            self.load_arrived_s = sample.elapsed_s
        self.load_samples += 1
        self.generating_samples += generated > 0
        running = metrics.running or 0
        self.peak_running = max(self.peak_running, running)
        self.busy_samples += running > 0
        threshold = self.config.concurrency_threshold
        self.concurrent_samples += bool(threshold and running >= threshold)

    def load_evidence(self) -> dict:
        """What the server's counters showed of the load (see LOAD_MIN_FRACTION)."""
        return {"arrived_elapsed_s": self.load_arrived_s, "metrics_samples": self.metrics_samples,
                "samples": self.load_samples,
                "generating_samples": self.generating_samples, "busy_samples": self.busy_samples,
                "concurrency": self.config.concurrency, "concurrency_threshold": self.config.concurrency_threshold,
                "concurrent_samples": self.concurrent_samples, "peak_running": self.peak_running,
                "min_fraction": LOAD_MIN_FRACTION}

    def _count_tokens(self, sample: Sample) -> float:
        """Counts the sample's tokens; returns the tokens generated since the sample before."""
        if not sample.metrics_ok:
            return 0.0
        total = sample.metrics.generation_tokens + (sample.metrics.prompt_tokens or 0)
        if self._tokens_prev is not None and total < self._tokens_prev:  # a new process: counters from 0
            self._tokens_offset += self._tokens_prev
        self._tokens_prev = total
        gen = sample.metrics.generation_tokens
        generated = 0.0
        if self._gen_prev is not None:  # a new process counts from 0 again
            generated = gen - self._gen_prev if gen >= self._gen_prev else gen
        self._gen_prev = gen
        point = (sample.elapsed_s, self._tokens_offset + total)
        # Throughput counts from the last sample before the counters move: the seconds before
        # the load generator sends its first request are not the server's to answer for.
        if self._tokens_first is None or point[1] == self._tokens_first[1]:
            self._tokens_first = point
        self._window.append(point)
        while len(self._window) > 2 and sample.elapsed_s - self._window[1][0] >= self.config.tokens_window_s:
            self._window.popleft()
        return generated


def without_internal_keys(record: dict) -> dict:
    """A crash or wedge without its internal (underscore) keys."""
    return {k: v for k, v in record.items() if not k.startswith("_")}
