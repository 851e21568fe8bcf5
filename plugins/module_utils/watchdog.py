"""The node watchdog of one vLLM instance: sees progress, not just HTTP 200.

Plain Python, stdlib only, no ``ansible`` import. The ``vllm_watchdog`` role copies this
file and ``vllm_progress.py`` onto the node as the package ``vllm_fleet_watchdog`` and runs
``main()`` from ``vllm-fleet-watchdog@<instance>.service``, a oneshot a timer starts every
few seconds. Each run observes once, decides against the state the earlier runs left, acts
and exits:

* **observe** -- ``systemctl show`` of ``vllm@<instance>.service``, ``/health`` and
  ``/metrics`` (``Observer``);
* **decide** -- ``decide(config, state, observation)``, a pure function, unit-tested
  without a node: ``healthy`` (progress, or nothing in flight), ``stalled`` (requests in
  flight, no progress yet for ``window_s``), ``wedged`` (in flight, no progress for
  ``window_s`` while ``/health`` answers 200 -- vLLM's ``/health`` only reports a dead
  engine, not a wedged one), ``unhealthy`` (``/health`` failing while systemd says the unit
  is active; acted on after ``window_s``), ``skipped_starting`` (activating, or within
  ``startup_grace_s`` of the start), ``inactive`` (systemd or an operator owns it),
  ``no_metrics``, ``metrics_incomplete`` (``/metrics`` lacks a series the judgement needs:
  the soak's rule, ``vllm_progress.missing_metrics``). A wedged or long-unhealthy instance is restarted at most
  ``max_restarts`` times in ``restart_window_s``; beyond that the run says
  ``rate_limited`` and does nothing: a flapping node is never restart-looped;
* **act** -- ``systemctl restart --no-block`` and one JSON line per event on stdout, which
  the unit sends to the journal (``SYSLOG_IDENTIFIER=vllm-fleet-watchdog``; a ``<N>``
  prefix sets the priority). Verdict lines only when the verdict changes: a healthy
  instance is quiet.

"Progress" is ``vllm_progress.progress_marker``, the soak gate's own notion: generated
tokens or requests the engine finished (``vllm_progress.FINISHED_WORK``: a request failed
with finished_reason "error" or aborted is none). Arriving requests are not progress: prompt tokens counted on
arrival and a queue fed by clients that time out and retry move while a wedged engine
generates nothing; in flight rising while generation is flat is part of the wedge evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field, replace

# Relative on purpose: the same import works in the collection (tests, Ansible) and on the
# node, where the role installs both files as the package `vllm_fleet_watchdog`.
from .vllm_progress import (
    EngineMetrics,
    http_get,
    incomplete_message,
    int_or_none,
    parse_systemctl_show,
)

SCHEMA_VERSION = 1
STATE_FILE = "state.json"
SYSLOG_IDENTIFIER = "vllm-fleet-watchdog"

# Journal priorities (sd-daemon(3) prefixes on stdout).
NOTICE, WARNING, ERR = 5, 4, 3
PRIORITY = {
    "healthy": NOTICE, "skipped_starting": NOTICE, "inactive": NOTICE, "no_metrics": NOTICE,
    "metrics_incomplete": WARNING,
    "stalled": WARNING, "unhealthy": WARNING, "wedged": WARNING, "restarted": WARNING,
    "rate_limited": ERR, "restart_failed": ERR, "state_reset": ERR,
}
# States in which systemd is starting or reloading the unit: its own start logic
# (ExecStartPost waits for /health, TimeoutStartSec bounds it) is in charge.
STARTING_STATES = ("activating", "reloading")


class WatchdogConfigError(ValueError):
    """The configuration cannot work; the message says what to change."""


# --------------------------------------------------------------------------- config

@dataclass(frozen=True)
class WatchdogConfig:
    instance: str
    base_url: str  # http://127.0.0.1:8000
    unit: str = ""  # default vllm@<instance>.service
    interval_s: float = 15.0  # how often the timer runs us (the decision does not need it)
    window_s: float = 120.0
    startup_grace_s: float = 60.0
    max_restarts: int = 3
    restart_window_s: float = 3600.0
    http_timeout_s: float = 5.0

    def __post_init__(self):
        if not self.unit:
            object.__setattr__(self, "unit", f"vllm@{self.instance}.service")

    def validate(self) -> "WatchdogConfig":
        problems = []
        if not self.instance:
            problems.append("instance is empty")
        if not self.base_url.startswith(("http://", "https://")):
            problems.append(f"base_url {self.base_url!r} is not an http(s) URL")
        for name in ("interval_s", "window_s", "restart_window_s", "http_timeout_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be above 0, got {getattr(self, name)!r}")
        if self.startup_grace_s < 0:
            problems.append(f"startup_grace_s must be 0 or more, got {self.startup_grace_s!r}")
        if self.max_restarts < 0:
            problems.append(f"max_restarts must be 0 (observe only) or more, got {self.max_restarts!r}")
        if self.interval_s > 0 and self.window_s < 2 * self.interval_s:
            problems.append(f"window_s ({self.window_s:g}) must be at least two intervals ({2 * self.interval_s:g}): "
                            "flat over a window needs two samples")
        if problems:
            raise WatchdogConfigError("watchdog config: " + "; ".join(problems))
        return self


def load_config(path: str, instance: str) -> WatchdogConfig:
    """The node's watchdog.json (written by the role) for one instance:
    ``{"schema_version": 1, <knobs>..., "instances": {"gpu0": {"base_url": ..., "unit": ...}}}``."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise WatchdogConfigError(f"cannot read the watchdog config {path}: {exc}")
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise WatchdogConfigError(f"{path}: not a watchdog config of schema_version {SCHEMA_VERSION}")
    instances = data.get("instances") or {}
    if instance not in instances:
        raise WatchdogConfigError(f"{path}: no instance {instance!r} (it has {', '.join(sorted(instances)) or 'none'}): "
                                  "apply the vllm_watchdog role with this instance in vllm_fleet_instances")
    knobs = {k: data[k] for k in ("interval_s", "window_s", "startup_grace_s", "max_restarts", "restart_window_s",
                                  "http_timeout_s") if k in data}
    entry = instances[instance]
    try:
        return WatchdogConfig(instance=instance, base_url=str(entry["base_url"]), unit=str(entry.get("unit") or ""),
                              **knobs).validate()
    except (KeyError, TypeError) as exc:
        raise WatchdogConfigError(f"{path}: instance {instance!r}: {exc!r}")


# --------------------------------------------------------------------------- state

@dataclass
class WatchdogState:
    """What one run leaves to the next (``<StateDirectory>/state.json``).

    Monotonic times (``*_mono``) belong to the process they were taken for (``process``:
    systemd's InvocationID and MainPID, new on every start); a new process, or a reboot,
    starts them again. Restart times are wall-clock epochs: the rate limit survives both.
    """

    process: str | None = None
    marker: list | None = None  # the last progress marker of `process`
    progress_mono: float | None = None  # when it last moved (or the instance was idle)
    progress_in_flight: float | None = None  # requests in flight then
    unhealthy_since_mono: float | None = None
    verdict: str | None = None  # the last verdict logged
    acted_process: str | None = None  # the process the last restart was asked for ...
    acted_mono: float | None = None  # ... and when
    rate_limited_process: str | None = None  # the process a rate_limited line was logged for
    restarts: list = field(default_factory=list)  # [{"time": epoch, "reason": "wedged"}, ...]

    def to_json(self) -> str:
        return json.dumps({"schema_version": SCHEMA_VERSION, **asdict(self)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "WatchdogState":
        """Raises ValueError on anything that is not a state this code wrote."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.pop("schema_version", None) != SCHEMA_VERSION:
            raise ValueError(f"not a watchdog state of schema_version {SCHEMA_VERSION}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}")
        state = cls(**data)
        restarts = state.restarts
        if not isinstance(restarts, list) or not all(
                isinstance(r, dict) and isinstance(r.get("time"), (int, float)) for r in restarts):
            raise ValueError("restarts is not a list of {time, reason}")
        for name in ("progress_mono", "unhealthy_since_mono", "acted_mono"):
            if getattr(state, name) is not None and not isinstance(getattr(state, name), (int, float)):
                raise ValueError(f"{name} is not a number")
        if state.marker is not None and not isinstance(state.marker, list):
            raise ValueError("marker is not a list")
        return state


def read_state(state_dir: str) -> tuple[WatchdogState, str | None]:
    """(state, problem): a missing file is a fresh start; a corrupt one too, with the reason."""
    path = os.path.join(state_dir, STATE_FILE)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return WatchdogState(), None
    except OSError as exc:
        return WatchdogState(), f"cannot read {path}: {exc}"
    try:
        return WatchdogState.from_json(raw.decode("utf-8")), None
    except (ValueError, TypeError) as exc:
        return WatchdogState(), f"{path} is corrupt ({exc}); starting afresh"


def write_state(state_dir: str, state: WatchdogState) -> None:
    path = os.path.join(state_dir, STATE_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(state.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- observation

@dataclass(frozen=True)
class Observation:
    """What one run saw. None: could not be read."""

    mono: float  # time.monotonic() (CLOCK_MONOTONIC, systemd's *Monotonic clock)
    wall: float  # time.time()
    active_state: str | None = None
    sub_state: str | None = None
    main_pid: int | None = None
    invocation: str | None = None  # InvocationID: new on every start of the unit
    exec_start_mono: float | None = None  # ExecMainStartTimestampMonotonic, in seconds
    n_restarts: int | None = None
    health: int | None = None  # HTTP status of /health
    health_error: str | None = None  # refused / timeout / another reason, when no status
    metrics: EngineMetrics | None = None  # None: /metrics did not answer 200

    @property
    def process(self) -> str | None:
        return f"{self.invocation or '-'}/{self.main_pid}" if self.main_pid else None


@dataclass
class Decision:
    verdict: str
    restart: bool  # the runner must restart the unit (already counted in state.restarts)
    lines: list  # events to log, in order (dicts with "event")
    state: WatchdogState


def _prune(restarts: list, now: float, window_s: float) -> list:
    return [r for r in restarts if now - r["time"] < window_s]


def _fmt(value) -> str:
    return "?" if value is None else f"{value:g}"


@dataclass
class Finding:
    """What one observation says about the engine; ``due``: the unit should be restarted."""

    verdict: str
    message: str
    detail: dict = field(default_factory=dict)
    due: bool = False


def _not_judged(cfg: WatchdogConfig, st: WatchdogState, obs: Observation) -> Finding | None:
    """Not ours to judge: systemd is starting the unit, it is not running, or it is in its
    start-up grace. Resets what a new process starts again."""
    if obs.active_state != "active" or not obs.main_pid:
        st.process, st.marker, st.progress_mono, st.unhealthy_since_mono = None, None, None, None
        if obs.active_state in STARTING_STATES:
            return Finding("skipped_starting", f"{cfg.unit} is {obs.active_state}: systemd is starting it")
        return Finding("inactive", f"{cfg.unit} is {obs.active_state or 'unknown'} ({obs.sub_state or '?'}): "
                                   "nothing to watch")
    if obs.process != st.process:  # a new process: its counters and clocks start again
        st.process, st.marker, st.progress_mono, st.unhealthy_since_mono = obs.process, None, None, None
    if obs.exec_start_mono is not None and obs.mono - obs.exec_start_mono < cfg.startup_grace_s:
        return Finding("skipped_starting", f"{cfg.unit} started {obs.mono - obs.exec_start_mono:.0f} s ago, within "
                                           f"the start-up grace of {cfg.startup_grace_s:g} s",
                       {"startup_grace_s": cfg.startup_grace_s})
    return None


def _load(cfg: WatchdogConfig, metrics: EngineMetrics | None) -> dict:
    def get(attr):
        return getattr(metrics, attr) if metrics else None
    return {"running": get("running"), "waiting": get("waiting"), "tokens": get("generation_tokens"),
            "prompt_tokens": get("prompt_tokens"), "kv_usage": get("kv_usage"), "window_s": cfg.window_s}


def _judge_unhealthy(cfg: WatchdogConfig, st: WatchdogState, obs: Observation, load: dict) -> Finding:
    """/health does not answer 200 while systemd says active: due after the window."""
    # No progress evidence now; when /health comes back the window starts again.
    st.marker, st.progress_mono = None, None
    if st.unhealthy_since_mono is None:
        st.unhealthy_since_mono = obs.mono
    failing_for = obs.mono - st.unhealthy_since_mono
    health = obs.health if obs.health is not None else obs.health_error
    return Finding("unhealthy", f"/health answers {health} while systemd says {cfg.unit} is active, for "
                                f"{failing_for:.0f} s (restart after {cfg.window_s:g} s)",
                   dict(load, health=health, failing_for_s=round(failing_for, 1)), due=failing_for >= cfg.window_s)


def _judge_progress(cfg: WatchdogConfig, st: WatchdogState, obs: Observation, load: dict) -> Finding:
    """/health answers 200: wedged when requests are in flight and the progress marker has
    not moved for the window."""
    st.unhealthy_since_mono = None
    metrics = obs.metrics
    marker = metrics.progress_marker if metrics else None
    missing = metrics.missing if metrics else []
    if missing:
        # Some series but not all: no evidence either way, like no metrics at all.
        return Finding("metrics_incomplete", f"{incomplete_message(missing)}: cannot judge progress of {cfg.unit}",
                       dict(load, missing=missing))
    if marker is None:
        # /health 200 but no metrics: no evidence either way; the window is neither reset nor acted on.
        return Finding("no_metrics", f"/health answers 200 but /metrics could not be read: cannot judge progress "
                                     f"of {cfg.unit}", load)
    in_flight = metrics.in_flight
    if not in_flight:
        # Idle is not a wedge, and idle time does not count: the window starts again at the
        # first sample that sees work.
        st.marker, st.progress_mono, st.progress_in_flight = None, None, None
        return Finding("healthy", f"{cfg.unit} answers /health and is idle", load)
    if st.marker is None or list(marker) != st.marker:
        moved = st.marker is not None
        st.marker, st.progress_mono, st.progress_in_flight = list(marker), obs.mono, in_flight
        if moved:  # it recovered: a later wedge of the same process is a new episode
            st.rate_limited_process = None
        return Finding("healthy", f"{cfg.unit} makes progress with {in_flight:g} request(s) in flight" if moved
                       else f"{cfg.unit} answers /health with {in_flight:g} request(s) in flight", load)
    flat_for = obs.mono - st.progress_mono
    detail = dict(load, health=200, flat_for_s=round(flat_for, 1), in_flight_at_progress=st.progress_in_flight)
    rising = (f" (rising from {st.progress_in_flight:g})" if st.progress_in_flight is not None
              and in_flight > st.progress_in_flight else "")
    if flat_for < cfg.window_s:
        return Finding("stalled", f"{in_flight:g} request(s) in flight{rising} and no progress for {flat_for:.0f} s "
                                  f"(wedged after {cfg.window_s:g} s)", detail)
    return Finding("wedged", f"{in_flight:g} request(s) in flight{rising} and no progress for {flat_for:.0f} s "
                             f"(window {cfg.window_s:g} s; generated tokens flat at "
                             f"{_fmt(metrics.generation_tokens)}, no request finished) while /health answers 200: "
                             "the engine is wedged", detail, due=True)


def _restart_or_hold(cfg: WatchdogConfig, st: WatchdogState, obs: Observation, finding: Finding,
                     line) -> tuple[bool, list]:
    """A due finding: restart, unless our restart of this process is still under way or the
    restart budget of the window is spent (said once per process)."""
    counts = {"restarts_in_window": len(st.restarts), "max_restarts": cfg.max_restarts,
              "restart_window_s": cfg.restart_window_s}
    if st.acted_process == obs.process and st.acted_mono is not None and obs.mono - st.acted_mono < cfg.window_s:
        # Our restart of this very process is still under way (the stop can take a while).
        return False, []
    if len(st.restarts) >= cfg.max_restarts:
        if st.rate_limited_process == obs.process:  # once per process, not every run
            return False, []
        st.rate_limited_process = obs.process
        return False, [line("rate_limited", (
            f"{cfg.unit} is {finding.verdict} but was restarted {len(st.restarts)} time(s) in the last "
            f"{cfg.restart_window_s:g} s (max_restarts {cfg.max_restarts}): not restarting it; "
            "a flapping node is for the rollout and the operators"), reason=finding.verdict, **finding.detail,
            **counts)]
    st.restarts = st.restarts + [{"time": obs.wall, "reason": finding.verdict}]
    st.acted_process, st.acted_mono = obs.process, obs.mono
    counts["restarts_in_window"] = len(st.restarts)
    return True, [line("restarted", f"restarting {cfg.unit} ({finding.verdict}): restart {len(st.restarts)} of at "
                                    f"most {cfg.max_restarts} in {cfg.restart_window_s:g} s",
                       reason=finding.verdict, **finding.detail, **counts)]


def decide(cfg: WatchdogConfig, state: WatchdogState, obs: Observation) -> Decision:
    """The verdict on one observation, the state for the next run, the lines to log and
    whether to restart. Pure: no clock, no I/O."""
    st = replace(state, restarts=_prune(state.restarts, obs.wall, cfg.restart_window_s))
    base = {"instance": cfg.instance, "unit": cfg.unit, "main_pid": obs.main_pid, "active_state": obs.active_state}

    def line(event: str, message: str, **extra) -> dict:
        return {"event": event, **base, **extra, "message": message}

    finding = _not_judged(cfg, st, obs)
    if finding is None:
        load = _load(cfg, obs.metrics)
        finding = (_judge_unhealthy if obs.health != 200 else _judge_progress)(cfg, st, obs, load)
    # A verdict is logged when it changes, not at every run.
    lines = [line(finding.verdict, finding.message, **finding.detail)] if finding.verdict != state.verdict else []
    st.verdict = finding.verdict
    restart = False
    if finding.due:
        restart, more = _restart_or_hold(cfg, st, obs, finding, line)
        lines += more
    return Decision(finding.verdict, restart, lines, st)


# --------------------------------------------------------------------------- observe, act

class Observer:
    """Reads the instance once: systemd's view, /health, /metrics."""

    SHOW = ("ActiveState", "SubState", "MainPID", "InvocationID", "ExecMainStartTimestampMonotonic", "NRestarts")

    def __init__(self, cfg: WatchdogConfig, run=subprocess.run):
        self.cfg = cfg
        self._run = run
        # Loopback probes must not go through an HTTP proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def systemd(self) -> dict[str, str]:
        argv = ["systemctl", "show", self.cfg.unit] + [f"--property={p}" for p in self.SHOW]
        try:
            proc = self._run(argv, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return parse_systemctl_show(proc.stdout) if proc.returncode == 0 else {}

    def http_get(self, path: str) -> tuple[int | None, str | None, str | None]:
        """(status, body, error) where error is refused / timeout / another reason."""
        return http_get(self._opener, self.cfg.base_url.rstrip("/") + path, self.cfg.http_timeout_s)

    def observe(self, mono=time.monotonic, wall=time.time) -> Observation:
        show = self.systemd()
        start_us = int_or_none(show.get("ExecMainStartTimestampMonotonic"))
        common = dict(active_state=show.get("ActiveState") or None, sub_state=show.get("SubState") or None,
                      main_pid=int_or_none(show.get("MainPID")), invocation=show.get("InvocationID") or None,
                      exec_start_mono=start_us / 1e6 if start_us else None, n_restarts=int_or_none(show.get("NRestarts")))
        if common["active_state"] != "active":  # not serving: no HTTP needed
            return Observation(mono(), wall(), **common)
        health, _, health_error = self.http_get("/health")
        metrics = None
        if health == 200:
            status, text, _ = self.http_get("/metrics")
            metrics = EngineMetrics.from_text(text) if status == 200 and text is not None else None
        return Observation(mono(), wall(), health=health, health_error=health_error, metrics=metrics, **common)

    def restart(self) -> tuple[bool, str]:
        """Queue a restart of the unit; do not wait for it (the stop and the model load take minutes)."""
        argv = ["systemctl", "restart", "--no-block", self.cfg.unit]
        try:
            proc = self._run(argv, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        return proc.returncode == 0, (proc.stderr or proc.stdout or "").strip()[-500:]


def journal_line(event: dict) -> str:
    """One event as the line the unit prints: ``<priority>{json}`` (systemd strips the prefix)."""
    return f"<{PRIORITY.get(event['event'], NOTICE)}>{json.dumps(event)}"


def run_once(cfg: WatchdogConfig, state_dir: str, *, observer: Observer | None = None, emit=print,
             dry_run: bool = False) -> Decision:
    """Read the state, observe, decide, act, log, write the state."""
    observer = observer or Observer(cfg)
    state, problem = read_state(state_dir)
    lines = []
    if problem:
        lines.append({"event": "state_reset", "instance": cfg.instance, "unit": cfg.unit, "message": problem})
    # A dry run (an operator asking) always prints the verdict, changed or not.
    decision = decide(cfg, replace(state, verdict=None) if dry_run else state, observer.observe())
    lines += decision.lines
    if decision.restart and not dry_run:
        ok, output = observer.restart()
        if not ok:
            lines.append({"event": "restart_failed", "instance": cfg.instance, "unit": cfg.unit,
                          "reason": decision.verdict, "message": f"systemctl restart {cfg.unit} failed: {output}"})
    if dry_run:
        lines = [dict(event, dry_run=True) for event in lines]
    for event in lines:
        emit(journal_line(event))
    if not dry_run:
        write_state(state_dir, decision.state)  # a failed restart still counts: never a loop
    return decision


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=SYSLOG_IDENTIFIER, description="One watchdog run for one vLLM instance.")
    parser.add_argument("--instance", required=True, help="instance name (vllm@<instance>.service)")
    parser.add_argument("--config", default="/etc/vllm-fleet/watchdog.json")
    parser.add_argument("--state-dir", default=os.environ.get("STATE_DIRECTORY", "").split(":")[0] or None,
                        help="default: $STATE_DIRECTORY (systemd's StateDirectory=)")
    parser.add_argument("--dry-run", action="store_true",
                        help="observe, decide and print every line; no restart, no state written")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.instance)
    except WatchdogConfigError as exc:
        print(f"<{ERR}>{exc}", file=sys.stderr)
        return 2
    if not args.state_dir:
        print(f"<{ERR}>no state directory: pass --state-dir or run under systemd with StateDirectory=", file=sys.stderr)
        return 2

    def emit(text):
        print(text, flush=True)

    run_once(cfg, args.state_dir, emit=emit, dry_run=args.dry_run)
    return 0
