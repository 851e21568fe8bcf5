"""The node watchdog's decision logic (plugins/module_utils/watchdog.py), without a node:
verdicts over a series of observations, the rate limit, the state file, one run end to end
with a fake systemctl and a real HTTP server, and the package as the role installs it."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import soak_monitor, vllm_progress
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import EngineMetrics
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.watchdog import (
    STATE_FILE,
    Observation,
    Observer,
    WatchdogConfig,
    WatchdogConfigError,
    WatchdogState,
    decide,
    journal_line,
    load_config,
    read_state,
    run_once,
    write_state,
)

ROOT = Path(__file__).resolve().parents[2]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
CFG = WatchdogConfig(instance="gpu0", base_url="http://127.0.0.1:8000", interval_s=15, window_s=60,
                     startup_grace_s=30, max_restarts=3, restart_window_s=3600).validate()
T0 = 10_000.0  # monotonic seconds
W0 = 1_800_000_000.0  # wall-clock epoch
START = T0 - 1000  # the process started long before the series


def metrics_text(running=0, waiting=0, gen=0.0, prompt=0.0, kv=0.0, success=0.0, preempt=0.0,
                 reason="length") -> str:
    labels = 'model_name="qwen",engine="0"'
    return "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {running}",
        f"vllm:num_requests_waiting{{{labels}}} {waiting}",
        f"vllm:generation_tokens_total{{{labels}}} {gen}",
        f"vllm:prompt_tokens_total{{{labels}}} {prompt}",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv}",
        f'vllm:request_success_total{{finished_reason="{reason}",{labels}}} {success}',
        f"vllm:num_preemptions_total{{{labels}}} {preempt}",
        "",
    ])


def obs(t: float, *, health=200, health_error=None, metrics: dict | None = None, active="active", pid=4242,
        invocation="inv-1", start=START, no_metrics=False) -> Observation:
    """An observation t seconds into the series."""
    engine = None
    if health == 200 and not no_metrics:
        engine = EngineMetrics.from_text(metrics_text(**(metrics or {})))
    return Observation(mono=T0 + t, wall=W0 + t, active_state=active, sub_state="running" if active == "active"
                       else "start-post", main_pid=pid if active == "active" else (pid if active == "activating"
                                                                                    else 0),
                       invocation=invocation, exec_start_mono=start, n_restarts=0, health=health,
                       health_error=health_error, metrics=engine)


def series(observations, cfg=CFG, state=None):
    """Feed observations one run after the other; every decision, and the state at the end."""
    state = state or WatchdogState()
    decisions = []
    for observation in observations:
        decision = decide(cfg, state, observation)
        decisions.append(decision)
        state = decision.state
    return decisions, state


def events(decisions) -> list[str]:
    return [line["event"] for d in decisions for line in d.lines]


# --------------------------------------------------------------------------- verdicts

def test_healthy_under_load_is_left_alone_and_logged_once():
    runs = [obs(15 * i, metrics={"running": 8, "waiting": 2, "gen": 100.0 * i, "prompt": 5000.0 * i, "kv": 0.4})
            for i in range(20)]  # 5 minutes, 5 windows
    decisions, _ = series(runs)
    assert all(d.verdict == "healthy" and not d.restart for d in decisions)
    assert events(decisions) == ["healthy"]  # not one line per run


def test_idle_with_flat_counters_is_not_a_wedge():
    runs = [obs(15 * i, metrics={"gen": 500.0, "prompt": 9000.0, "kv": 0.0}) for i in range(20)]
    decisions, _ = series(runs)
    assert {d.verdict for d in decisions} == {"healthy"} and not any(d.restart for d in decisions)


def test_idle_time_does_not_count_towards_the_window():
    """Idle for ten minutes, then a request arrives and the counters stay flat: the window
    starts when work is first seen, not when the counters last moved."""
    idle = [obs(15 * i, metrics={"gen": 500.0}) for i in range(40)]  # 0 .. 585 s
    busy = [obs(600 + 15 * i, metrics={"running": 1, "gen": 500.0}) for i in range(1, 6)]  # 615 .. 675 s
    decisions, _ = series(idle + busy)
    assert [d.verdict for d in decisions[-5:]] == ["healthy", "stalled", "stalled", "stalled", "wedged"]
    assert [d.restart for d in decisions].index(True) == len(decisions) - 1  # 60 s after work was first seen


def moving_series(key, step, reason="length"):
    runs = []
    for i in range(20):  # five minutes, requests running, only `key` moves
        values = {"running": 32, "gen": 0.0, "prompt": 0.0, "kv": 0.0, "success": 0.0, "preempt": 0.0,
                  "reason": reason}
        values[key] = step * i
        runs.append(obs(15 * i, metrics=values))
    return series(runs)[0]


@pytest.mark.parametrize("key, step", [("gen", 50.0), ("success", 1.0)])  # tokens generated, requests finished
def test_generated_tokens_and_finished_requests_are_progress(key, step):
    decisions = moving_series(key, step)
    assert {d.verdict for d in decisions} == {"healthy"}
    assert not any(d.restart for d in decisions)


@pytest.mark.parametrize("reason", ["stop", "length", "repetition"])
def test_requests_the_engine_finished_are_progress_by_every_finished_reason_of_work(reason):
    """Real 0.25.1's finished_reason values (v1/engine/__init__.py FINISH_REASON_STRINGS) that end a generation."""
    assert {d.verdict for d in moving_series("success", 1.0, reason)} == {"healthy"}


@pytest.mark.parametrize("reason", ["error", "abort", "a-reason-a-later-vllm-adds"])
def test_requests_failed_or_aborted_are_not_progress(reason):
    """An engine that fails every request (finished_reason="error", answered 500) or whose
    clients give up ("abort") generates nothing: a wedge, not progress."""
    decisions = moving_series("success", 1.0, reason)
    assert decisions[4].verdict == "wedged" and [d.restart for d in decisions].index(True) == 4


@pytest.mark.parametrize("key, step", [
    ("prompt", 32768.0),  # prompt tokens counted as requests arrive
    ("kv", 0.01),
    ("preempt", 1.0),
])
def test_nothing_else_hides_a_wedge(key, step):
    decisions = moving_series(key, step)
    assert decisions[4].verdict == "wedged" and [d.restart for d in decisions].index(True) == 4  # 60 s flat


def test_clients_retrying_against_a_wedged_engine_do_not_hide_it():
    """The case that alternated stalled/healthy: prompt tokens counted on arrival, clients
    that time out and retry, so in flight and prompt tokens rise while nothing is generated."""
    runs = [obs(0, metrics={"running": 4, "gen": 900.0, "prompt": 1000.0})]
    runs += [obs(15 * i, metrics={"running": 4, "waiting": 2 * i, "gen": 1000.0, "prompt": 1000.0 + 512 * i,
                                  "success": 3.0}) for i in range(1, 7)]
    decisions, state = series(runs)
    assert [d.verdict for d in decisions] == ["healthy", "healthy", "stalled", "stalled", "stalled", "wedged",
                                              "wedged"]
    wedged = decisions[5].lines[0]
    assert wedged["in_flight_at_progress"] == 6 and wedged["waiting"] == 10
    assert wedged["message"].startswith("14 request(s) in flight (rising from 6) and no progress for 60 s")
    assert decisions[5].restart and state.restarts[0]["reason"] == "wedged"


def test_missing_request_gauges_are_metrics_incomplete_never_idle_or_busy():
    text = 'vllm:generation_tokens_total{engine="0"} 500\n'  # num_requests_running/waiting absent
    partial = [replace(obs(15 * i), metrics=EngineMetrics.from_text(text)) for i in range(10)]
    decisions, _ = series(partial)
    assert {d.verdict for d in decisions} == {"metrics_incomplete"} and not any(d.restart for d in decisions)
    [line] = events_lines = [line for d in decisions for line in d.lines]
    assert line["missing"] == ["vllm:num_requests_running", "vllm:num_requests_waiting"]
    assert line["message"] == (
        "metrics incomplete: vllm:num_requests_running, vllm:num_requests_waiting missing from /metrics, so a "
        "wedged engine cannot be told from an idle one: cannot judge progress of vllm@gpu0.service")
    assert len(events_lines) == 1
    # The soak says it in the same words.
    monitor = soak_monitor.Monitor(soak_monitor.MonitorConfig(wedge_window_s=4))
    [event] = monitor.observe(soak_monitor.Sample.from_observations(0.0, health=200, metrics_text=text))
    assert line["message"].startswith(event["evidence"])


def test_wedge_after_the_window_restarts_once():
    flat = {"running": 3, "gen": 1234.0, "prompt": 50000.0, "kv": 0.3}
    runs = [obs(0, metrics={**flat, "gen": 1000.0})] + [obs(15 * i, metrics=flat) for i in range(1, 7)]
    decisions, state = series(runs)
    # progress seen at 15 s; flat from there: stalled at 30..60, wedged at 75 (60 s flat)
    assert [d.verdict for d in decisions] == ["healthy", "healthy", "stalled", "stalled", "stalled", "wedged",
                                              "wedged"]
    assert [d.restart for d in decisions] == [False] * 5 + [True, False]  # the restart is under way at 90
    assert events(decisions) == ["healthy", "stalled", "wedged", "restarted"]
    wedged, restarted = decisions[5].lines
    assert wedged["event"] == "wedged" and wedged["running"] == 3 and wedged["tokens"] == 1234.0
    assert wedged["flat_for_s"] == 60.0 and wedged["window_s"] == 60
    assert restarted["reason"] == "wedged" and restarted["restarts_in_window"] == 1
    assert len(state.restarts) == 1 and state.restarts[0]["reason"] == "wedged"


def test_waiting_requests_that_never_start_are_a_wedge_too():
    runs = [obs(15 * i, metrics={"running": 0, "waiting": 4, "gen": 10.0}) for i in range(6)]
    decisions, _ = series(runs)
    assert decisions[-2].verdict == "wedged" and decisions[-2].restart


def test_not_wedged_one_second_before_the_window():
    runs = [obs(0, metrics={"running": 1, "gen": 1.0}), obs(59, metrics={"running": 1, "gen": 1.0})]
    decisions, _ = series(runs)
    assert decisions[-1].verdict == "stalled" and not decisions[-1].restart


def test_a_new_process_starts_the_window_again():
    flat = {"running": 2, "gen": 7.0}
    old = [obs(15 * i, metrics=flat) for i in range(4)]  # 45 s flat on the old process
    new = [obs(60 + 15 * i, metrics=flat, invocation="inv-2", pid=5555) for i in range(3)]  # 30 s on the new one
    decisions, _ = series(old + new)
    assert not any(d.restart for d in decisions)
    assert decisions[-1].verdict == "stalled"


def test_a_restart_under_way_is_not_asked_for_again():
    flat = {"running": 2, "gen": 7.0}
    runs = [obs(15 * i, metrics=flat) for i in range(10)]  # the old process lingers 75 s after the restart
    decisions, state = series(runs)
    assert [d.restart for d in decisions].count(True) == 2  # at 60 s, and once more a window later
    assert [i for i, d in enumerate(decisions) if d.restart] == [4, 8]
    assert len(state.restarts) == 2


# --------------------------------------------------------------------------- health and start-up

def test_health_failing_while_active_restarts_after_the_window():
    runs = [obs(0, metrics={"running": 1, "gen": 1.0})] + [obs(15 * i, health=503) for i in range(1, 7)]
    decisions, _ = series(runs)
    assert [d.verdict for d in decisions[1:]] == ["unhealthy"] * 6
    assert [d.restart for d in decisions] == [False] * 5 + [True, False]
    assert events(decisions) == ["healthy", "unhealthy", "restarted"]
    assert decisions[1].lines[0]["health"] == 503
    assert decisions[5].lines[0]["reason"] == "unhealthy" and decisions[5].lines[0]["failing_for_s"] == 60.0


@pytest.mark.parametrize("error", ["refused", "timeout"])
def test_no_answer_at_all_is_unhealthy(error):
    runs = [obs(15 * i, health=None, health_error=error) for i in range(6)]
    decisions, _ = series(runs)
    assert decisions[4].restart and decisions[0].lines[0]["health"] == error


def test_health_that_recovers_within_the_window_is_left_alone():
    runs = [obs(0, health=503), obs(15, health=503), obs(30, metrics={"gen": 1.0}), obs(45, health=503),
            obs(60, health=503), obs(75, health=503)]
    decisions, _ = series(runs)
    assert not any(d.restart for d in decisions)  # never 60 s in a row
    assert events(decisions) == ["unhealthy", "healthy", "unhealthy"]


def test_a_unit_systemd_is_starting_is_never_judged():
    runs = [obs(15 * i, active="activating", health=None, health_error="refused") for i in range(20)]
    decisions, _ = series(runs)
    assert {d.verdict for d in decisions} == {"skipped_starting"}
    assert not any(d.restart for d in decisions) and events(decisions) == ["skipped_starting"]


def test_within_the_start_up_grace_nothing_is_judged():
    start = T0 + 100  # the process started 100 s into the series; grace 30 s
    runs = [obs(100 + 10 * i, health=503, start=start) for i in range(3)]  # 100..120: within
    runs += [obs(130 + 15 * i, health=503, start=start) for i in range(6)]  # 130..205
    decisions, _ = series(runs)
    assert [d.verdict for d in decisions[:3]] == ["skipped_starting"] * 3
    assert decisions[3].verdict == "unhealthy"
    assert [i for i, d in enumerate(decisions) if d.restart] == [7]  # 60 s after the grace ended, at 190


@pytest.mark.parametrize("state", ["inactive", "failed", "deactivating"])
def test_a_unit_that_is_not_running_is_not_ours(state):
    runs = [obs(15 * i, active=state, health=None, health_error="refused") for i in range(10)]
    decisions, _ = series(runs)
    assert {d.verdict for d in decisions} == {"inactive"} and not any(d.restart for d in decisions)


def test_metrics_missing_is_no_evidence_either_way():
    flat = {"running": 1, "gen": 3.0}
    runs = [obs(0, metrics=flat), obs(15, no_metrics=True), obs(30, no_metrics=True), obs(45, metrics=flat),
            obs(60, metrics=flat)]
    decisions, _ = series(runs)
    assert [d.verdict for d in decisions] == ["healthy", "no_metrics", "no_metrics", "stalled", "wedged"]
    assert decisions[-1].restart  # the window ran on through the gap, but nothing acted during it


# --------------------------------------------------------------------------- rate limit

def wedge_episode(t: float, invocation: str) -> list[Observation]:
    """One process wedged from the start: restart due a window after it was first seen."""
    return [obs(t + 15 * i, metrics={"running": 1, "gen": 9.0}, invocation=invocation, pid=1000 + int(t))
            for i in range(5)]


def test_rate_limit_counts_restarts_and_logs_once():
    cfg = replace(CFG, max_restarts=2, restart_window_s=3600)
    runs = wedge_episode(0, "a") + wedge_episode(100, "b") + wedge_episode(200, "c")
    runs += [obs(275 + 15 * i, metrics={"running": 1, "gen": 9.0}, invocation="c", pid=1200) for i in range(20)]
    decisions, state = series(runs, cfg)
    assert sum(d.restart for d in decisions) == 2
    assert events(decisions).count("rate_limited") == 1  # the flapping node is not spammed either
    limited = next(line for d in decisions for line in d.lines if line["event"] == "rate_limited")
    assert limited["reason"] == "wedged" and limited["restarts_in_window"] == 2 and limited["max_restarts"] == 2
    assert len(state.restarts) == 2


def test_a_new_wedge_of_a_recovered_process_is_reported_again():
    cfg = replace(CFG, max_restarts=0)
    flat, moving = {"running": 1, "gen": 9.0}, [{"running": 1, "gen": 9.0 + i} for i in range(1, 3)]
    runs = [obs(15 * i, metrics=flat) for i in range(6)]  # wedged, rate_limited
    runs += [obs(90 + 15 * i, metrics=m) for i, m in enumerate(moving)]  # resumed (an operator)
    runs += [obs(120 + 15 * i, metrics=moving[-1]) for i in range(6)]  # wedged again
    decisions, _ = series(runs, cfg)
    assert events(decisions) == ["healthy", "stalled", "wedged", "rate_limited", "healthy", "stalled", "wedged",
                                 "rate_limited"]


def test_rate_limit_expires_with_its_window():
    cfg = replace(CFG, max_restarts=1, restart_window_s=600)
    decisions, state = series(wedge_episode(0, "a") + wedge_episode(100, "b"), cfg)
    assert sum(d.restart for d in decisions) == 1 and "rate_limited" in events(decisions)
    # 600 s after the first restart (at 60 s) the limit has room again: same wedged process
    later = [obs(600 + 15 * i, metrics={"running": 1, "gen": 9.0}, invocation="b", pid=1100) for i in range(5)]
    decisions, state = series(later, cfg, state)
    assert [i for i, d in enumerate(decisions) if d.restart] == [4]  # 660 s: the first restart is 600 s old
    assert [r["time"] for r in state.restarts] == [W0 + 660]


def test_max_restarts_zero_only_observes():
    cfg = replace(CFG, max_restarts=0)
    decisions, state = series(wedge_episode(0, "a"), cfg)
    assert not any(d.restart for d in decisions)
    assert events(decisions) == ["healthy", "stalled", "wedged", "rate_limited"] and state.restarts == []


# --------------------------------------------------------------------------- state file

def test_state_round_trip(tmp_path):
    _, state = series(wedge_episode(0, "a"))
    write_state(str(tmp_path), state)
    again, problem = read_state(str(tmp_path))
    assert problem is None and again == state
    assert json.loads((tmp_path / STATE_FILE).read_text())["schema_version"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name != STATE_FILE]  # no temporary file left


def test_missing_state_is_a_fresh_start(tmp_path):
    assert read_state(str(tmp_path)) == (WatchdogState(), None)


@pytest.mark.parametrize("content", [
    "{not json",
    "",
    "[]",
    '{"schema_version": 99}',
    '{"schema_version": 1, "restarts": "many"}',
    '{"schema_version": 1, "restarts": [{"reason": "wedged"}]}',
    '{"schema_version": 1, "progress_mono": "soon"}',
    '{"schema_version": 1, "bogus": 1}',
])
def test_corrupt_state_is_reported_and_replaced(tmp_path, content):
    (tmp_path / STATE_FILE).write_text(content)
    state, problem = read_state(str(tmp_path))
    assert state == WatchdogState() and "corrupt" in problem


class FakeObserver:
    def __init__(self, observation, restart_ok=True):
        self.observation = observation
        self.restart_ok = restart_ok
        self.restarts = 0

    def observe(self):
        return self.observation

    def restart(self):
        self.restarts += 1
        return self.restart_ok, "" if self.restart_ok else "Job for vllm@gpu0.service canceled."


def wedged_state() -> WatchdogState:
    _, state = series([obs(0, metrics={"running": 1, "gen": 9.0})])
    return state


def test_run_once_with_a_corrupt_state_file_goes_on(tmp_path):
    (tmp_path / STATE_FILE).write_bytes(b"\x00\xff garbage")
    lines = []
    run_once(CFG, str(tmp_path), observer=FakeObserver(obs(0, metrics={"gen": 1.0})), emit=lines.append)
    assert [json.loads(line[3:])["event"] for line in lines] == ["state_reset", "healthy"]
    assert lines[0].startswith("<3>")
    assert read_state(str(tmp_path))[1] is None  # rewritten whole


def test_run_once_restarts_and_keeps_count(tmp_path):
    write_state(str(tmp_path), wedged_state())
    observer, lines = FakeObserver(obs(60, metrics={"running": 1, "gen": 9.0})), []
    run_once(CFG, str(tmp_path), observer=observer, emit=lines.append)
    assert observer.restarts == 1
    assert [json.loads(line[3:])["event"] for line in lines] == ["wedged", "restarted"]
    assert len(read_state(str(tmp_path))[0].restarts) == 1


def test_a_failed_restart_is_logged_and_still_counted(tmp_path):
    write_state(str(tmp_path), wedged_state())
    observer, lines = FakeObserver(obs(60, metrics={"running": 1, "gen": 9.0}), restart_ok=False), []
    run_once(CFG, str(tmp_path), observer=observer, emit=lines.append)
    failed = json.loads(lines[-1][3:])
    assert failed["event"] == "restart_failed" and "canceled" in failed["message"]
    assert len(read_state(str(tmp_path))[0].restarts) == 1  # never a loop of attempts


def test_dry_run_neither_restarts_nor_writes(tmp_path):
    write_state(str(tmp_path), wedged_state())
    before = (tmp_path / STATE_FILE).read_text()
    observer, lines = FakeObserver(obs(60, metrics={"running": 1, "gen": 9.0})), []
    run_once(CFG, str(tmp_path), observer=observer, emit=lines.append, dry_run=True)
    assert observer.restarts == 0 and (tmp_path / STATE_FILE).read_text() == before
    assert [json.loads(line[3:])["event"] for line in lines] == ["wedged", "restarted"]
    assert all(json.loads(line[3:])["dry_run"] for line in lines)


def test_journal_line_is_priority_then_json():
    decision = decide(CFG, wedged_state(), obs(60, metrics={"running": 2, "waiting": 1, "gen": 9.0}))
    wedged, restarted = (journal_line(line) for line in decision.lines)
    assert wedged.startswith("<4>") and restarted.startswith("<4>")
    record = json.loads(wedged[3:])
    assert '"event": "wedged"' in wedged
    for key in ("instance", "unit", "main_pid", "running", "waiting", "tokens", "window_s", "flat_for_s", "message"):
        assert key in record
    assert json.loads(restarted[3:])["restarts_in_window"] == 1


# --------------------------------------------------------------------------- config

def write_config(path: Path, **overrides) -> Path:
    data = {"schema_version": 1, "interval_s": 2, "window_s": 6, "startup_grace_s": 3, "max_restarts": 1,
            "restart_window_s": 3600, "http_timeout_s": 2,
            "instances": {"gpu0": {"unit": "vllm@gpu0.service", "base_url": "http://127.0.0.1:18400"}}}
    data.update(overrides)
    path.write_text(json.dumps(data))
    return path


def test_config_is_read_for_one_instance(tmp_path):
    cfg = load_config(str(write_config(tmp_path / "watchdog.json")), "gpu0")
    assert (cfg.unit, cfg.base_url, cfg.window_s, cfg.max_restarts) == ("vllm@gpu0.service",
                                                                          "http://127.0.0.1:18400", 6, 1)


@pytest.mark.parametrize("overrides, instance, fragment", [
    ({}, "gpu7", "no instance 'gpu7'"),
    ({"window_s": 3}, "gpu0", "at least two intervals"),
    ({"max_restarts": -1}, "gpu0", "max_restarts"),
    ({"schema_version": 2}, "gpu0", "schema_version"),
    ({"instances": {"gpu0": {}}}, "gpu0", "base_url"),
])
def test_config_errors_say_what_to_change(tmp_path, overrides, instance, fragment):
    with pytest.raises(WatchdogConfigError, match=fragment):
        load_config(str(write_config(tmp_path / "watchdog.json", **overrides)), instance)


# --------------------------------------------------------------------------- one notion of progress

def test_the_soak_and_the_watchdog_share_one_notion_of_progress():
    text = metrics_text(running=2, waiting=1, gen=10.0, prompt=99.0, kv=0.25, success=3.0, preempt=1.0)
    sample = soak_monitor.Sample.from_observations(0.0, health=200, metrics_text=text)
    engine = EngineMetrics.from_text(text)
    assert sample.metrics == engine  # the soak's tick holds the watchdog's reading, not a copy of its fields
    assert engine.progress_marker == (10.0, 3.0) and engine.in_flight == 3


def two_engines(kv=(0.43, 0.43)) -> str:
    out = []
    for engine, usage in enumerate(kv):
        labels = f'model_name="qwen",engine="{engine}"'
        out += [f"vllm:num_requests_running{{{labels}}} 2", f"vllm:num_requests_waiting{{{labels}}} 1",
                f"vllm:generation_tokens_total{{{labels}}} 100", f"vllm:prompt_tokens_total{{{labels}}} 900",
                f"vllm:kv_cache_usage_perc{{{labels}}} {usage}", f"vllm:num_preemptions_total{{{labels}}} 1",
                f'vllm:request_success_total{{{labels},finished_reason="stop"}} 4',
                f'vllm:request_success_total{{{labels},finished_reason="abort"}} 7']
    return "\n".join(out) + "\n"


def test_one_aggregation_rule_per_metric_across_engines():
    engine = EngineMetrics.from_text(two_engines())
    assert (engine.running, engine.waiting, engine.in_flight) == (4, 2, 6)  # queue gauges add up
    assert (engine.generation_tokens, engine.prompt_tokens, engine.preemptions) == (200, 1800, 2)  # counters too
    assert engine.kv_usage == 0.43  # the fullest engine, not 0.86
    assert (engine.success_total, engine.finished) == (22, 8)  # aborted requests are not finished work
    sample = soak_monitor.Sample.from_observations(0.0, health=200, metrics_text=two_engines((0.2, 0.6)))
    assert sample.metrics.kv_usage == 0.6 and sample.metrics.in_flight == 6
    assert vllm_progress.aggregate(vllm_progress.parse_prometheus(two_engines()), "vllm:kv_cache_usage_perc") == 0.43


def test_vllm_metrics_module_uses_the_same_rule(server):
    _Handler.metrics = two_engines()
    try:
        env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"}
        proc = subprocess.run([Path(sys.executable).parent / "ansible", "localhost", "-i", "localhost,", "-c", "local",
                               "-e", f"ansible_python_interpreter={sys.executable}", "-m", "vllm_fleet.fleet.vllm_metrics",
                               "-a", f"url=http://127.0.0.1:{server.server_address[1]}/metrics"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        _Handler.metrics = metrics_text(running=1, gen=5.0)
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["metrics"]["kv_cache_usage_perc"] == 0.43 and result["metrics"]["num_requests_running"] == 4
    assert result["in_flight"] == 6 and result["missing"] == []



# --------------------------------------------------------------------------- observe, for real

class _Handler(http.server.BaseHTTPRequestHandler):
    health = 200
    metrics = metrics_text(running=1, gen=5.0)

    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            self.send_response(self.health)
            self.end_headers()
        else:
            body = self.metrics.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def fake_systemctl(calls, show_out):
    def run(argv, **_):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=show_out if argv[1] == "show" else "", stderr="")
    return run


def test_observer_reads_systemd_health_and_metrics(server):
    cfg = replace(CFG, base_url=f"http://127.0.0.1:{server.server_address[1]}")
    calls = []
    show = ("ActiveState=active\nSubState=running\nMainPID=77\nInvocationID=abc\n"
            "ExecMainStartTimestampMonotonic=5000000\nNRestarts=2\n")
    observer = Observer(cfg, run=fake_systemctl(calls, show))
    seen = observer.observe()
    assert (seen.active_state, seen.main_pid, seen.invocation, seen.exec_start_mono) == ("active", 77, "abc", 5.0)
    assert seen.health == 200 and seen.metrics.running == 1 and seen.metrics.generation_tokens == 5.0
    assert calls[0][:3] == ["systemctl", "show", "vllm@gpu0.service"]
    assert observer.restart() == (True, "")
    assert calls[-1] == ["systemctl", "restart", "--no-block", "vllm@gpu0.service"]


def test_observer_on_a_refused_port_and_an_inactive_unit():
    cfg = replace(CFG, base_url="http://127.0.0.1:9")  # discard: nothing listens
    seen = Observer(cfg, run=fake_systemctl([], "ActiveState=active\nMainPID=5\n")).observe()
    assert seen.health is None and seen.health_error == "refused" and seen.metrics is None
    calls = []
    seen = Observer(cfg, run=fake_systemctl(calls, "ActiveState=failed\nMainPID=0\n")).observe()
    assert seen.active_state == "failed" and seen.health is None and len(calls) == 1  # no HTTP for a dead unit


def test_the_package_as_installed_on_the_node_runs_in_isolated_mode(tmp_path, server):
    """The role copies watchdog.py and vllm_progress.py into vllm_fleet_watchdog/: that must
    import nothing from Ansible or the collection (python -I: no PYTHONPATH, no cwd)."""
    package = tmp_path / "libexec" / "vllm_fleet_watchdog"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("watchdog.py", "vllm_progress.py"):
        shutil.copy(MODULE_UTILS / name, package / name)
    config = write_config(tmp_path / "watchdog.json", instances={
        "gpu0": {"unit": "vllm@gpu0.service", "base_url": f"http://127.0.0.1:{server.server_address[1]}"}})
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text("#!/bin/sh\nprintf 'ActiveState=active\\nMainPID=9\\nInvocationID=x\\n'\n")
    (bindir / "systemctl").chmod(0o755)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    program = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
               "from vllm_fleet_watchdog.watchdog import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-I", "-B", "-c", program, str(package.parent), "--instance", "gpu0",
                           "--config", str(config)], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bindir}:{os.environ['PATH']}", "STATE_DIRECTORY": str(state_dir)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("<5>{")
    line = json.loads(proc.stdout.splitlines()[0][3:])
    assert (line["event"], line["running"], line["tokens"]) == ("healthy", 1, 5.0)
    assert json.loads((state_dir / STATE_FILE).read_text())["marker"] == [5.0, 0.0]
    assert not list(package.glob("__pycache__"))  # -B: nothing written next to the code
