"""The soak gate: observe one vLLM instance under load, decide a verdict.

Plain Python on purpose (no ``ansible`` import), split by concern:

* ``soak_monitor`` -- ``Sample`` and the ``Monitor`` state machine (crashes, wedges, failed
  requests), pure functions over observations;
* ``soak_stats`` -- performance against a baseline and the crash-rate statistics (``proof``);
* ``soak_bench`` -- the load: ``vllm bench serve`` from the release venv, run after run;
* this module -- the config, ``verdict``, ``NodeProbe`` (``/health``, ``/metrics``,
  ``systemctl show``, ``journalctl``) and ``run_soak``, the loop the ``soak`` module runs.

The soak's files live in ``state_dir``: ``progress.jsonl`` (one line per sample, read by
``soak_status``), ``verdict.json`` (written once, atomically, at the end) and ``bench/``
(each run's summary and log), all root's. The bench itself, run as the probe user, writes only
under ``scratch_dir`` (``soak_bench.make_scratch``).

The verdict fails a soak that did not deliver its load (``load_proof``): no load run completed
a request (the cause read from the bench's output), or the server's counters did not show the
configured concurrency running and tokens generated for most of it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.identity import IdentityError, as_user
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_bench import (
    DEFAULT_SCRATCH_DIR,
    REFERENCE_CONCURRENCY,
    REFERENCE_INPUT_LEN,
    REFERENCE_OUTPUT_LEN,
    BenchLoad,
    aggregate_bench,
    check_tokenizer,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_monitor import (
    CONCURRENCY_FRACTION,
    DEFAULT_JOURNAL_PATTERNS,
    LOAD_MIN_FRACTION,
    JournalLine,
    Monitor,
    MonitorConfig,
    Sample,
    parse_journal_json,
    utc_iso,
    without_internal_keys,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import (
    PERF_METRICS,
    SoakConfigError,
    format_number,
    judge_performance,
    performance_message,
    proof,
    validate_performance_spec,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import (
    http_get,
    incomplete_message,
    parse_systemctl_show,
)

SCHEMA_VERSION = 1

PROGRESS_FILE = "progress.jsonl"
VERDICT_FILE = "verdict.json"


# --------------------------------------------------------------------------- verdict

def failure_reasons(monitor: Monitor, *, elapsed_s: float, stopped: str) -> list[str]:
    """Why the soak failed, before performance is looked at: one sentence per reason."""
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
    return reasons


def server_load_problems(seen: dict) -> list[tuple[str, str]]:
    """(cause, sentence) for what the server's counters did not show of the load (``Monitor.load_evidence``)."""
    if not seen["metrics_samples"]:
        return [("no_metrics", "the server exported no vllm:* metrics, so its side of the load cannot be seen (vLLM "
                               "started with --disable-log-stats exports none)")]
    if not seen["samples"]:
        return [("no_request", "the server saw no request during the soak (check base_url, model and the load "
                               "generator's log under bench/)")]
    problems = []
    if seen["generating_samples"] < LOAD_MIN_FRACTION * seen["samples"]:
        problems.append(("not_generating", f"the server generated tokens in {seen['generating_samples']} of the "
                                           f"{seen['samples']} samples after the load arrived, fewer than "
                                           f"{LOAD_MIN_FRACTION:.0%}"))
    threshold = seen["concurrency_threshold"]
    if threshold and seen["peak_running"] < threshold:
        problems.append(("concurrency_not_reached",
                         f"vllm:num_requests_running never reached {threshold} ({CONCURRENCY_FRACTION:.0%} of the "
                         f"concurrency {seen['concurrency']}; peak {seen['peak_running']:g} over "
                         f"{seen['busy_samples']} samples with requests running): the server's max-num-seqs or KV "
                         "cache may be below the load"))
    return problems


def load_proof(monitor: Monitor, bench_results: list[dict], failures: list[dict]) -> dict:
    """Whether the soak delivered its load, from both sides: the bench's runs completed
    requests, and the server's own counters showed tokens generated and the configured
    concurrency running for most of the soak (``soak_monitor.LOAD_MIN_FRACTION``). ``cause``
    names the first thing missing; ``reason`` says all of it, or is None when delivered."""
    seen = monitor.load_evidence()
    problems: list[tuple[str, str]] = []
    if not bench_results and failures:
        runs = sum(1 for f in failures if f["run"])  # a failure without a run: found before the load started
        problems.append((failures[-1]["cause"], (f"no load run completed a request ({runs} run(s) failed); "
                                                 if runs else "") + failures[-1]["message"]))
    elif not bench_results:
        problems.append(("no_run_finished", "no load run finished within the soak: make the soak outlast one run "
                                            "(about run_s seconds after the bench starts)"))
    if monitor.samples:  # else the soak stopped before its first sample: nothing to say of the server
        problems += server_load_problems(seen)
    return {"delivered": not problems, "cause": problems[0][0] if problems else None,
            "reason": ("Load not delivered: " + "; ".join(text for _, text in problems) + ".") if problems else None,
            "runs_completed": len(bench_results),
            "requests_completed": sum(int(r.get("completed") or 0) for r in bench_results),
            "failed_runs": failures[-3:], "server": seen}


def observed_performance(monitor: Monitor, agg: dict | None, server_tps: float | None) -> tuple[dict, str | None]:
    """The figures to judge and where they came from: the load runs, else the server's own counters."""
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
    return observed, source


def performance_reasons(performance: dict, *, elapsed_s: float, min_duration_s: float) -> list[str]:
    """Why a soak that did not break and delivered its load still fails: a metric out of
    tolerance, too short."""
    reasons = [performance_message(key, m) + "." for key, m in performance["metrics"].items() if m["passed"] is False]
    if elapsed_s < min_duration_s:
        reasons.append(f"The soak ran {elapsed_s:.0f} s, less than the minimum of {min_duration_s:.0f} s.")
    return reasons


def verdict_notes(proved: dict, performance: dict, throughput: dict, *, baseline: dict | None) -> list[str]:
    """What the verdict cannot say on its own: what was not proved, judged or measured, and how."""
    notes = []
    if proved.get("not_proved"):
        notes.append(proved["not_proved"])
    if proved.get("target_statement"):
        notes.append(proved["target_statement"])
    if performance["unmeasured"]:
        notes.append(f"Not measured, so not judged: {', '.join(performance['unmeasured'])}.")
    if not baseline:
        notes.append("No baseline given: performance was recorded, not judged.")
    if performance["source"] == "metrics":
        notes.append("No load run finished within the soak: throughput is the server's own count from /metrics.")
    elif performance["source"] == "bench":
        reported = throughput["reported"]
        notes.append(f"The gate judged throughput recomputed from the load runs' token totals over their duration "
                     f"({format_number(throughput['recomputed'])} tokens/s); the bench reported "
                     + (f"{format_number(reported)} tokens/s." if reported is not None
                        else "no total_token_throughput."))
    return notes


def verdict(monitor: Monitor, *, elapsed_s: float, duration_s: float, min_duration_s: float,
            bench_results: list[dict], baseline: dict | None = None, tolerances: dict | None = None,
            target_mtbf_hours: float | None = None, confidence: float = 0.95, load_failures: list[dict] = (),
            stopped: str = "completed", shape: dict | None = None, extra: dict | None = None) -> dict:
    """The soak's verdict: passed, one sentence per reason, performance, the load's proof, and
    what it proved."""
    reasons = failure_reasons(monitor, elapsed_s=elapsed_s, stopped=stopped)
    load = load_proof(monitor, bench_results, list(load_failures))
    # A crash or wedge explains the rest; metrics incomplete leave the server's side unseen.
    if not (load["delivered"] or monitor.crashes or monitor.wedges or monitor.metrics_incomplete):
        reasons.append(load["reason"])
    agg = aggregate_bench(bench_results)
    server_tps = monitor.server_tokens_per_s()
    observed, source = observed_performance(monitor, agg, server_tps)
    performance = judge_performance(observed, baseline, tolerances)
    performance["source"] = source
    if not reasons:
        reasons = performance_reasons(performance, elapsed_s=elapsed_s, min_duration_s=min_duration_s)
    passed = not reasons
    # Why it failed, in one word where there is one (crash, wedge, ...), else its first reason.
    failure = None if passed else (monitor.stop_reason or (stopped if stopped != "completed" else None)
                                   or reasons[0].rstrip("."))
    proved = proof(len(monitor.crashes), elapsed_s / 60, confidence, target_mtbf_hours, failure=failure)
    throughput = {"gate_used": source and ("bench_totals" if source == "bench" else "server_metrics"),
                  "recomputed": observed.get("total_token_throughput"),
                  "reported": (agg or {}).get("reported_total_token_throughput")}
    notes = verdict_notes(proved, performance, throughput, baseline=baseline)
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
        "crashes": [without_internal_keys(c) for c in monitor.crashes],
        "wedges": [without_internal_keys(w) for w in monitor.wedges],
        "failed_requests": monitor.failed_requests,
        "failed_request_errors": monitor.failed_request_errors,
        "performance": performance,
        "kv_cache_peak": monitor.kv_peak,
        "tokens_per_s": (agg or {}).get("total_token_throughput", server_tps),
        "bench_tokens_per_s": throughput["reported"],
        "server_tokens_per_s": server_tps,
        "throughput": throughput,
        "load": {"shape": shape or {}, "runs": len(bench_results), "aggregate": agg, "proof": load},
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


def pid_alive(pid) -> bool | None:
    """Whether a process with this pid exists (None: not a pid)."""
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
        result["running"] = pid_alive(last.get("pid"))
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
    # Who runs the release's `vllm bench serve` (third-party code): never the root that runs the soak.
    run_as: str | None = None
    # Where each soak gets the bench's own directory (its results, its HOME): outside the release tree.
    scratch_dir: str = DEFAULT_SCRATCH_DIR

    def validate(self) -> None:
        if not self.unit:
            raise SoakConfigError("unit is empty: name the serving unit, e.g. vllm@gpu0")
        try:
            as_user(self.run_as)
        except IdentityError as exc:
            raise SoakConfigError(f"run_as: {exc}") from None
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
        if not os.path.isabs(self.scratch_dir) or os.path.normpath(self.scratch_dir) == "/":
            raise SoakConfigError(f"scratch_dir must be an absolute path below /, got {self.scratch_dir!r}")
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
                             max_failed_requests=self.max_failed_requests, concurrency=self.concurrency)


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


class ProgressWriter:
    """``progress.jsonl``: one line per phase change and per sample, for ``soak_status``."""

    def __init__(self, state_dir: str, duration_s: float, wall=time.time):
        self.path = os.path.join(state_dir, PROGRESS_FILE)
        self._handle = open(self.path, "a", encoding="utf-8")
        self._duration_s = duration_s
        self._wall = wall
        self._pid = os.getpid()

    def write(self, phase: str, elapsed: float, monitor: Monitor | None = None, load: BenchLoad | None = None,
              extra: dict | None = None) -> None:
        line = {"t": round(self._wall(), 3), "pid": self._pid, "phase": phase, "duration_s": self._duration_s}
        if monitor:
            line.update(monitor.progress())
            line["bench_runs"] = len(load.results)
        line["elapsed_s"] = round(elapsed, 1)
        line.update(extra or {})
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


def check_can_start(cfg: SoakConfig, probe: NodeProbe, load: BenchLoad | None) -> None:
    """The unit exists and, unless a load is given, the release venv can run the bench."""
    state = probe.systemd()
    if state.get("LoadState") != "loaded":
        raise SoakError(f"unit {cfg.unit} is not loaded (LoadState={state.get('LoadState') or 'unknown'}): "
                        "install and start the serving unit (vllm_service role) before the soak")
    if load is None and not os.access(cfg.vllm_bin or "", os.X_OK):
        raise SoakError(f"{cfg.vllm_bin} is not an executable: venv must be the release venv that has vllm "
                        "installed (the load is its `vllm bench serve`)")


def wait_ready(cfg: SoakConfig, probe: NodeProbe, progress: ProgressWriter, *, clock, sleep, should_stop) -> None:
    """Until ``/health`` is 200 and the unit active, or ``ready_timeout_s`` (then SoakError)."""
    ready_start = clock()
    while True:
        health, _, error = probe.http_get("/health")
        state = probe.systemd()
        if health == 200 and state.get("ActiveState") == "active":
            return
        waited = clock() - ready_start
        if waited >= cfg.ready_timeout_s or should_stop():
            raise SoakError(f"{cfg.unit} was not ready after {waited:.0f} s (/health: {health or error}, "
                            f"ActiveState {state.get('ActiveState')}): read `journalctl -u {cfg.unit}`, and "
                            "wait for readiness before soaking or raise ready_timeout_s")
        progress.write("waiting_ready", 0.0, extra={"health": health or error})
        sleep(min(1.0, cfg.sample_interval_s))


def soak_loop(cfg: SoakConfig, probe: NodeProbe, load: BenchLoad, monitor: Monitor, progress: ProgressWriter,
              start: float, *, clock, sleep, should_stop) -> tuple[str, float]:
    """Sample and keep the load running until a failure, a stop or ``duration_s``:
    (how it stopped, seconds elapsed)."""
    tick = start
    while True:
        elapsed = clock() - start
        monitor.observe(probe.sample(elapsed))
        finished = load.poll()
        if finished is not None:
            monitor.add_bench(finished, elapsed)
        progress.write("soak", elapsed, monitor, load)
        if monitor.failed:
            return monitor.stop_reason, elapsed
        if not load.running and load.consecutive_errors >= 2:  # twice in a row: not a fluke
            return "load_error", elapsed
        if should_stop():
            return "interrupted", elapsed
        if elapsed >= cfg.duration_s:
            return "completed", elapsed
        if not load.running:
            load.start()
        tick += cfg.sample_interval_s
        now = clock()
        if tick < now:  # a slow tick: do not burst to catch up
            tick = now
        sleep(max(0.0, min(tick, start + cfg.duration_s) - now))


def await_crash_evidence(cfg: SoakConfig, probe: NodeProbe, monitor: Monitor, *, clock, sleep, wall) -> None:
    """The signal that stopped the soak (a 503) can come a moment before the CUDA line
    reaches the journal: give the evidence a short grace to arrive."""
    grace_end = clock() + cfg.evidence_grace_s
    while not monitor.crash_has_journal_evidence() and clock() < grace_end:
        sleep(0.25)
        monitor.add_journal(probe.journal(), wall())
    sleep(0.25)  # and the lines logged right after it (EngineDeadError follows the CUDA error)
    monitor.add_journal(probe.journal(), wall())


def run_record(cfg: SoakConfig, probe: NodeProbe, monitor: Monitor, load: BenchLoad, *, elapsed: float,
               cpu_self: float, started: float, finished: float) -> dict:
    """What the verdict records of the run itself: the instance, the times, the monitor's cost."""
    return {
        "unit": cfg.unit,
        "base_url": cfg.base_url,
        "venv": cfg.venv,
        "model": cfg.model,
        "started_at": utc_iso(started),
        "finished_at": utc_iso(finished),
        "monitor": {
            "samples": monitor.samples,
            "sample_interval_s": cfg.sample_interval_s,
            "wedge_window_s": cfg.wedge_window_s,
            "journal_patterns": list(cfg.journal_patterns),
            "cpu_self_s": round(cpu_self, 3),
            "cpu_probes_s": round(probe.cpu_children_s, 3),
            "cpu_percent_of_one_core": round(100 * (cpu_self + probe.cpu_children_s) / max(elapsed, 1e-9), 2),
        },
    }


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
    progress = ProgressWriter(cfg.state_dir, cfg.duration_s, wall)
    try:
        check_can_start(cfg, probe, load)
        # A tokenizer the bench could not read: said before any load, as the cause the bench would give.
        unreadable = None if load else check_tokenizer(cfg)
        load = load or BenchLoad(cfg, cfg.state_dir)
        monitor = Monitor(cfg.monitor_config())
        if unreadable:
            load.failures.append({"run": None, "exit_status": None, **unreadable})
            stopped, elapsed, start_wall = "load_error", 0.0, wall()
        else:
            wait_ready(cfg, probe, progress, clock=clock, sleep=sleep, should_stop=should_stop)
            start, start_wall = clock(), wall()
            probe.start_journal(start_wall)
            load.start()
            stopped, elapsed = soak_loop(cfg, probe, load, monitor, progress, start, clock=clock,
                                         sleep=sleep, should_stop=should_stop)
        load.stop()
        if monitor.crashes:
            await_crash_evidence(cfg, probe, monitor, clock=clock, sleep=sleep, wall=wall)
        record = run_record(cfg, probe, monitor, load, elapsed=elapsed, cpu_self=time.process_time() - cpu0,
                            started=start_wall, finished=wall())
        result = verdict(
            monitor, elapsed_s=elapsed, duration_s=cfg.duration_s, min_duration_s=cfg.min_duration_s,
            bench_results=load.results, baseline=cfg.baseline, tolerances=cfg.tolerances,
            target_mtbf_hours=cfg.target_mtbf_hours, confidence=cfg.confidence, load_failures=load.failures,
            stopped=stopped, shape=cfg.shape, extra=record)
        write_json_atomic(os.path.join(cfg.state_dir, VERDICT_FILE), result)
        progress.write("done", elapsed, monitor, load, {"passed": result["passed"]})
        return result
    finally:
        if load is not None:
            load.close()
        progress.close()
