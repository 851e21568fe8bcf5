"""The soak gate's decisions (module_utils/soak*.py) as plain Python: parsing, the monitor's
crash and wedge rules, performance against a baseline, the statistics, the verdict, and
the soak loop itself driven by a fake clock, node and load."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import soak, soak_bench, soak_monitor, soak_stats, vllm_progress
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import SoakConfig, SoakError
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_monitor import JournalLine, Monitor, MonitorConfig, Sample
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import SoakConfigError
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import EngineMetrics

ROOT = Path(__file__).resolve().parents[2]
# What the real vllm 0.25.1 `vllm bench serve` wrote and printed, per case (captured: see its README).
REAL_BENCH = ROOT / "tests" / "fixtures" / "vllm_bench_real"
STANDIN_METRICS = ROOT / "tests" / "fixtures" / "vllm_standin" / "src" / "vllm" / "metrics.py"
CUDA_LINE = ("(EngineCore_DP0 pid=412) ERROR 05-12 10:11:12 [core.py:912] torch.AcceleratorError: "
             "CUDA error: an illegal memory access was encountered")
DEAD_LINE = ("(APIServer pid=398) ERROR 05-12 10:11:12 [async_llm.py:489] vllm.v1.engine.exceptions.EngineDeadError: "
             "EngineCore encountered an issue. See stack trace (above) for the root cause.")


# ------------------------------------------------------------------ Prometheus

def standin_metrics_text(running=3, waiting=1, kv=0.42, generated=1234, prompt=56789, stop=5, length=7) -> str:
    """The stand-in server's real /metrics renderer (loaded by path: no `vllm` import here)."""
    spec = importlib.util.spec_from_file_location("_standin_metrics", STANDIN_METRICS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    metrics = module.Metrics("/models/qwen3.6-35b-a3b-nvfp4")
    metrics.generation_tokens, metrics.prompt_tokens = generated, prompt
    metrics.finished.update(stop=stop, length=length)
    metrics.tpot.observe(0.031)
    return metrics.render(running=running, waiting=waiting, kv_usage=kv)


def test_parses_the_standin_metrics_text():
    text = standin_metrics_text()
    series = vllm_progress.parse_prometheus(text)

    assert vllm_progress.metric_sum(series, "vllm:num_requests_running") == 3
    assert vllm_progress.metric_sum(series, "vllm:num_requests_waiting") == 1
    assert vllm_progress.metric_sum(series, "vllm:kv_cache_usage_perc") == pytest.approx(0.42)
    assert vllm_progress.metric_sum(series, "vllm:generation_tokens_total") == 1234
    assert vllm_progress.metric_sum(series, "vllm:prompt_tokens_total") == 56789
    assert vllm_progress.metric_sum(series, "vllm:request_success_total") == 12
    assert vllm_progress.metric_sum(series, "vllm:request_success_total", finished_reason="length") == 7
    labels, _ = series["vllm:num_requests_running"][0]
    assert labels == {"model_name": "/models/qwen3.6-35b-a3b-nvfp4", "engine": "0"}
    assert vllm_progress.metric_sum(series, "vllm:request_time_per_output_token_seconds_count") == 1
    assert all(name.startswith("vllm:") for name in series)

    sample = Sample.from_observations(4.0, metrics_text=text, health=200,
                                      systemd={"NRestarts": "0", "MainPID": "412", "ActiveState": "active"})
    assert (sample.metrics.running, sample.metrics.waiting, sample.metrics.kv_usage) == (3, 1, pytest.approx(0.42))
    assert (sample.metrics.generation_tokens, sample.metrics.success_total) == (1234, 12)
    assert (sample.main_pid, sample.n_restarts) == (412, 0)


def test_prometheus_edge_cases():
    text = "\n".join([
        "# HELP vllm:x help text",
        "# TYPE vllm:x gauge",
        'vllm:x{model_name="a \\"quoted\\" name, with} brace",engine="0"} 2.5 1700000000000',
        'vllm:x{model_name="b",engine="1"} NaN',
        'vllm:y_bucket{le="+Inf",engine="0"} +Inf',
        "vllm:bare 7",
        "process_cpu_seconds_total 99",
        "vllm:broken{engine=",
        "vllm:nonumber abc",
    ])
    series = vllm_progress.parse_prometheus(text)
    assert set(series) == {"vllm:x", "vllm:y_bucket", "vllm:bare"}
    assert series["vllm:x"][0][0]["model_name"] == 'a "quoted" name, with} brace'
    assert vllm_progress.metric_sum(series, "vllm:x") == 2.5  # NaN is skipped, not summed
    assert math.isinf(series["vllm:y_bucket"][0][1])
    assert vllm_progress.metric_sum(series, "vllm:bare") == 7
    assert vllm_progress.metric_sum(series, "vllm:missing") is None


def test_systemctl_show_and_journal_json():
    assert vllm_progress.parse_systemctl_show("NRestarts=2\nMainPID=411\nActiveState=active\nSubState=running\n") == {
        "NRestarts": "2", "MainPID": "411", "ActiveState": "active", "SubState": "running"}
    entries = [
        {"__CURSOR": "s=1;i=1", "__REALTIME_TIMESTAMP": "1700000000123456", "MESSAGE": CUDA_LINE},
        {"__CURSOR": "s=1;i=2", "__REALTIME_TIMESTAMP": "1700000000200000", "MESSAGE": list(b"bytes \xff message")},
    ]
    lines, cursor = soak_monitor.parse_journal_json("\n".join(json.dumps(e) for e in entries) + "\nnot json\n")
    assert cursor == "s=1;i=2"
    assert lines[0] == JournalLine(pytest.approx(1700000000.123456), CUDA_LINE)
    assert lines[1].text.startswith("bytes ") and lines[1].text.endswith(" message")


# ------------------------------------------------------------------ the monitor

def healthy(t, gen=None, running=4, pid=412, restarts=0, kv=None, journal=(), prompt=None, waiting=0, **kw):
    """A healthy tick; by default the engine progressed (tokens grow with t)."""
    gen = t * 100 if gen is None else gen
    metrics = EngineMetrics(running=running, waiting=waiting, generation_tokens=gen,
                            prompt_tokens=t * 1000 if prompt is None else prompt,
                            kv_usage=0.3 if kv is None else kv, success_total=0, preemptions=0,
                            finished=kw.pop("finished", None))
    return Sample(t, time=1e9 + t, health=200, n_restarts=restarts, main_pid=pid, active_state="active",
                  metrics=metrics, journal=[JournalLine(1e9 + t - 0.5, line) for line in journal], **kw)


def feed(monitor, samples):
    events = []
    for sample in samples:
        events += monitor.observe(sample)
    return events


def test_a_steady_engine_raises_nothing():
    monitor = Monitor(MonitorConfig(wedge_window_s=10))
    assert feed(monitor, [healthy(t) for t in range(0, 60, 2)]) == []
    assert not monitor.failed and monitor.kv_peak == pytest.approx(0.3)
    assert monitor.tokens_per_s() == pytest.approx(1100)
    assert monitor.progress()["crashes"] == 0


@pytest.mark.parametrize("bad, kind, evidence", [
    ({"restarts": 1}, "restart", "NRestarts 0 -> 1"),
    ({"pid": 977}, "main_pid", "MainPID changed 412 -> 977"),
    ({"pid": 0}, "main_pid", "exited"),
    ({"health": 503}, "health_503", "503"),
    ({"health": None, "health_error": "refused"}, "health_down", "refused"),
    ({"active_state": "activating"}, "unit_state", "activating"),
    ({"journal": [CUDA_LINE]}, "cuda_error", "CUDA error: an illegal memory access"),
    ({"journal": ["torch.AcceleratorError: CUDA error: misaligned address"]}, "cuda_error", "misaligned address"),
    ({"journal": [DEAD_LINE]}, "cuda_error", "EngineDeadError"),
])
def test_each_crash_signal_is_a_crash(bad, kind, evidence):
    monitor = Monitor()
    feed(monitor, [healthy(0), healthy(2)])
    sample = healthy(4, **{k: v for k, v in bad.items() if k in ("restarts", "pid", "journal")})
    for key in ("health", "health_error", "active_state"):
        if key in bad:
            setattr(sample, key, bad[key])
    [event] = monitor.observe(sample)
    assert event["kind"] == kind
    assert evidence in event["evidence"]
    assert monitor.failed and monitor.stop_reason == "crash"


def test_one_engine_death_over_several_ticks_is_one_crash_with_the_cuda_line_as_evidence():
    monitor = Monitor()
    dead = healthy(4)
    dead.health = 503
    exited = healthy(6, pid=0)
    exited.health, exited.health_error, exited.active_state = None, "refused", "activating"
    back = healthy(12, pid=977, restarts=1, gen=5)
    events = feed(monitor, [healthy(0), healthy(2), dead, exited])
    assert len(events) == 1 and events[0]["kind"] == "health_503"
    monitor.add_journal([JournalLine(1e9 + 3.9, CUDA_LINE), JournalLine(1e9 + 3.9, DEAD_LINE)])
    feed(monitor, [back, healthy(14, pid=977, restarts=1, gen=300)])
    [crash] = monitor.crashes
    assert crash["evidence"] == CUDA_LINE
    assert {s["kind"] for s in crash["signals"]} == {"health_503", "health_down", "main_pid", "unit_state",
                                                     "restart", "cuda_error"}
    assert crash["recovered_elapsed_s"] == 12
    assert crash["detection_latency_s"] == pytest.approx(0.1)
    # the restarted process counts from zero again; a second death is a second crash
    second = healthy(16, pid=977, restarts=1, gen=310)
    second.health = 503
    feed(monitor, [second])
    assert len(monitor.crashes) == 2


def test_a_crash_and_restart_between_two_ticks_is_still_seen():
    monitor = Monitor()
    feed(monitor, [healthy(0), healthy(2)])
    [event] = monitor.observe(healthy(4, pid=977, restarts=1, gen=3))
    assert event["kind"] == "restart" and "MainPID changed 412 -> 977" in json.dumps(event["signals"])


def test_wedge_when_requests_run_and_nothing_moves_with_health_200():
    monitor = Monitor(MonitorConfig(wedge_window_s=10))
    feed(monitor, [healthy(t) for t in (0, 2, 4)])  # generating until t=4 (400 tokens)
    flat = [healthy(t, gen=400, prompt=4000, kv=0.5) for t in (6, 8, 10, 12)]
    assert feed(monitor, flat) == []  # 8 s flat: not yet
    [wedge] = monitor.observe(healthy(14, gen=400, prompt=4000, kv=0.5))
    assert wedge["kind"] == "no_progress"
    assert wedge["since_elapsed_s"] == 4 and wedge["flat_for_s"] == 10
    assert "4 request(s) in flight" in wedge["evidence"] and "flat at 400" in wedge["evidence"]
    assert monitor.stop_reason == "wedge"
    assert monitor.observe(healthy(18, gen=400, prompt=4000, kv=0.5)) == []  # reported once


def test_arriving_requests_do_not_hide_a_wedge():
    """Prompt tokens counted on arrival, clients that time out and retry: in flight and
    prompt tokens rise, the KV gauge moves, nothing is generated or finished."""
    monitor = Monitor(MonitorConfig(wedge_window_s=10))
    feed(monitor, [healthy(t) for t in (0, 2, 4)])
    retries = [healthy(t, gen=400, prompt=4000 + 500 * t, kv=0.3 + 0.01 * t, running=4, waiting=t - 4)
               for t in (6, 8, 10, 12, 14)]
    [wedge] = feed(monitor, retries)
    assert (wedge["kind"], wedge["since_elapsed_s"], wedge["in_flight_at_last_progress"]) == ("no_progress", 4, 4)
    assert "14 request(s) in flight (rising from 4) and no progress" in wedge["evidence"]


def test_requests_finishing_without_new_tokens_are_progress():
    # Negative control of the above: the same rising queue, but requests finish.
    monitor = Monitor(MonitorConfig(wedge_window_s=4))
    ticks = [healthy(t, gen=400, running=4, waiting=t, finished=t) for t in range(0, 20, 2)]
    assert feed(monitor, ticks) == [] and monitor.stop_reason is None


def test_missing_request_gauges_are_metrics_incomplete_not_a_traceback():
    text = "vllm:generation_tokens_total{engine=\"0\"} 400\n"  # no num_requests_running/waiting
    monitor = Monitor(MonitorConfig(wedge_window_s=4))
    ticks = [Sample.from_observations(t, time=1e9 + t, health=200, metrics_text=text,
                                      systemd={"NRestarts": "0", "MainPID": "412", "ActiveState": "active"})
             for t in range(0, 20, 2)]
    assert ticks[0].metrics.in_flight is None
    events = feed(monitor, ticks)
    assert [e["kind"] for e in events] == ["metrics_incomplete"] and monitor.wedges == []
    assert monitor.stop_reason == "metrics_incomplete"
    assert events[0]["missing"] == ["vllm:num_requests_running", "vllm:num_requests_waiting"]
    out = soak.verdict(monitor, elapsed_s=18, duration_s=60, min_duration_s=10, bench_results=[],
                       stopped=monitor.stop_reason)
    assert out["passed"] is False
    assert out["reasons"][0].startswith(
        "metrics incomplete: vllm:num_requests_running, vllm:num_requests_waiting missing from /metrics")
    # Negative control: the same ticks with the gauges are judged (idle: nothing to say).
    full = Monitor(MonitorConfig(wedge_window_s=4))
    with_gauges = text + "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    assert feed(full, [Sample.from_observations(t, health=200, metrics_text=with_gauges) for t in range(0, 20, 2)]) == []
    assert full.stop_reason is None


def test_no_wedge_when_idle_or_dead_or_prefilling():
    idle = Monitor(MonitorConfig(wedge_window_s=4))
    assert feed(idle, [healthy(t, gen=100, prompt=9, running=0) for t in range(0, 30, 2)]) == []

    # a prefill shorter than the window: nothing generated for a while, then tokens
    prefill = Monitor(MonitorConfig(wedge_window_s=6))
    ticks = [healthy(t, gen=0, prompt=0, kv=0.01 * t) for t in range(0, 6, 2)]
    assert feed(prefill, ticks + [healthy(t, gen=10 * t) for t in range(6, 30, 2)]) == []

    # flat tokens while /health says 503 is a crash, not a wedge
    dead = Monitor(MonitorConfig(wedge_window_s=4))
    ticks = [healthy(0)] + [healthy(t, gen=0, prompt=0) for t in range(2, 20, 2)]
    for tick in ticks[1:]:
        tick.health = 503
    feed(dead, ticks)
    assert dead.wedges == [] and len(dead.crashes) == 1


def test_waiting_requests_that_never_run_are_a_wedge_too():
    monitor = Monitor(MonitorConfig(wedge_window_s=4))
    events = feed(monitor, [healthy(t, gen=10, prompt=10, running=0, waiting=6) for t in range(0, 10, 2)])
    assert [e["kind"] for e in events] == ["no_progress"]


def test_a_server_that_stops_answering_is_a_wedge():
    monitor = Monitor(MonitorConfig(wedge_window_s=6))
    feed(monitor, [healthy(0), healthy(2)])
    silent = [Sample(t, time=1e9 + t, health=None, health_error="timeout", n_restarts=0, main_pid=412,
                     active_state="active") for t in (4, 6, 8, 10)]
    events = feed(monitor, silent)
    assert [e["kind"] for e in events] == ["unresponsive"]


def test_failed_requests_over_the_limit():
    monitor = Monitor(MonitorConfig(max_failed_requests=2))
    assert monitor.add_bench({"failed": 2, "errors": ["", "500 Internal Server Error: boom", ""]}, 30) == []
    assert not monitor.failed
    [event] = monitor.add_bench({"failed": 1, "errors": ["timeout"]}, 60)
    assert event["failed"] == 3 and event["evidence"].startswith("500")
    assert monitor.stop_reason == "failed_requests"


def test_bad_journal_pattern_is_a_config_error():
    with pytest.raises(SoakConfigError, match="regular expression"):
        Monitor(MonitorConfig(journal_patterns=("CUDA error(",)))


# ------------------------------------------------------------------ performance

BASELINE = {"total_token_throughput": 14000, "output_throughput": 44, "mean_tpot_ms": 40, "kv_cache_peak": 0.43}


@pytest.mark.parametrize("observed, failing", [
    ({"total_token_throughput": 13400, "output_throughput": 42, "mean_tpot_ms": 43.9, "kv_cache_peak": 0.47}, []),
    ({"total_token_throughput": 13200, "output_throughput": 44, "mean_tpot_ms": 40, "kv_cache_peak": 0.43},
     ["total_token_throughput"]),
    ({"total_token_throughput": 15000, "output_throughput": 44, "mean_tpot_ms": 44.1, "kv_cache_peak": 0.49},
     ["kv_cache_peak", "mean_tpot_ms"]),
])
def test_performance_against_baseline_with_tolerances(observed, failing):
    judged = soak_stats.judge_performance(observed, BASELINE, {})
    assert sorted(k for k, m in judged["metrics"].items() if not m["passed"]) == failing
    assert judged["passed"] == (not failing)
    assert judged["metrics"]["total_token_throughput"]["limit"] == pytest.approx(13300)
    assert judged["metrics"]["kv_cache_peak"]["limit"] == pytest.approx(0.48)


def test_tolerances_override_and_unmeasured_metrics_are_not_failures():
    judged = soak_stats.judge_performance({"total_token_throughput": 13200}, BASELINE, {"total_token_throughput": 0.10})
    assert judged["metrics"]["total_token_throughput"]["passed"] is True
    assert judged["unmeasured"] == ["kv_cache_peak", "mean_tpot_ms", "output_throughput"]
    assert judged["passed"] is True


@pytest.mark.parametrize("baseline, tolerances, message", [
    ({"tokens_per_second": 1}, {}, "unknown metric 'tokens_per_second'"),
    ({"mean_tpot_ms": "fast"}, {}, "must be a number > 0, got 'fast'"),
    ({"total_token_throughput": 0}, {}, "must be a number > 0, got 0"),
    ({"kv_cache_peak": 55}, {}, "0-1 fraction"),
    ({"mean_tpot_ms": 40}, {"output_throughput": 0.1}, "no baseline.output_throughput"),
    (12800, {}, "baseline must be a mapping of metric name to number, got an integer 12800"),
    ("", {}, "baseline must be a mapping"),
    ({"total_token_throughput": 12800}, [0.05], "tolerances must be a mapping"),
])
def test_baseline_typos_are_refused(baseline, tolerances, message):
    with pytest.raises(SoakConfigError, match=message):
        soak_stats.validate_performance_spec(baseline, tolerances)


@pytest.mark.parametrize("tolerance", [5, 0.5, 0.75, 0, -0.05, True, "0.05"])
def test_a_tolerance_outside_the_range_is_refused_with_the_range(tolerance):
    with pytest.raises(SoakConfigError) as refused:
        soak_stats.validate_performance_spec({"total_token_throughput": 12800}, {"total_token_throughput": tolerance},
                                       baseline_name="vllm_fleet_soak_baseline",
                                       tolerances_name="vllm_fleet_soak_tolerances")
    message = str(refused.value)
    assert message.startswith("vllm_fleet_soak_tolerances.total_token_throughput")
    assert repr(tolerance) in message
    if not isinstance(tolerance, (bool, str)) and tolerance > 0:
        assert "0 < tolerance < 0.5 (0.05 for 5%)" in message


@pytest.mark.parametrize("tolerance", [0.001, 0.05, 0.49])
def test_a_tolerance_inside_the_range_is_taken(tolerance):
    soak_stats.validate_performance_spec({"total_token_throughput": 12800, "kv_cache_peak": 0.55},
                                   {"total_token_throughput": tolerance, "kv_cache_peak": tolerance})


def test_tolerance_5_meant_as_5_percent_no_longer_passes_everything():
    """The negative control of the bounds: judged alone, a tolerance of 5 lets a release at
    a tenth of the baseline through; the validation that every entry point runs refuses it."""
    judged = soak_stats.judge_performance({"total_token_throughput": 1280}, {"total_token_throughput": 12800},
                                    {"total_token_throughput": 5})
    assert judged["passed"] is True
    with pytest.raises(SoakConfigError, match="0 < tolerance < 0.5"):
        SoakConfig(unit="vllm@gpu0", state_dir="/s", duration_s=600, venv="/v",
                   baseline={"total_token_throughput": 12800}, tolerances={"total_token_throughput": 5}).validate()


@pytest.mark.parametrize("key, observed, base, tolerance, message", [
    ("total_token_throughput", 13960.4, 15000, 0.05,
     "total_token_throughput: 13,960 tokens/s is 6.9% below the baseline 15,000 (tolerance 5%)"),
    ("output_throughput", 38.25, 44, 0.1, "output_throughput: 38.2 tokens/s is 13.1% below the baseline 44 "
                                          "(tolerance 10%)"),
    ("mean_tpot_ms", 52.1, 40, 0.1, "mean_tpot_ms: 52.1 ms is 30.2% above the baseline 40 (tolerance 10%)"),
    ("request_throughput", 0.61, 0.75, 0.125, "request_throughput: 0.61 req/s is 18.7% below the baseline 0.75 "
                                              "(tolerance 12.5%)"),
    ("kv_cache_peak", 0.612, 0.55, 0.05, "kv_cache_peak: 61.2% is 6.2 points above the baseline 55% "
                                         "(tolerance 5 points)"),
])
def test_a_failed_metric_reads_in_thousands_and_percent(key, observed, base, tolerance, message):
    judged = soak_stats.judge_performance({key: observed}, {key: base}, {key: tolerance})
    assert judged["metrics"][key]["passed"] is False
    assert soak_stats.performance_message(key, judged["metrics"][key]) == message


def test_the_shipped_profiles_carry_a_valid_baseline_and_nvfp4_keeps_its_win():
    """The gate is on by default: each profile's figures at the reference load, valid as the
    soak module takes them; NVFP4's bar is at least the FP8 figure, its KV peak lower."""
    profiles = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "profiles").glob("*.yml")}
    fp8, nvfp4 = profiles["qwen3.6-35b-a3b-fp8"]["baseline"], profiles["qwen3.6-35b-a3b-nvfp4-sm120"]["baseline"]
    assert fp8 == {"total_token_throughput": 12800, "kv_cache_peak": 0.55}
    assert nvfp4["total_token_throughput"] >= fp8["total_token_throughput"]
    assert nvfp4["kv_cache_peak"] == pytest.approx(fp8["kv_cache_peak"] - 0.12)
    for name, data in profiles.items():
        soak_stats.validate_performance_spec(data["baseline"], {})


def test_bench_runs_aggregate_by_totals_and_worst_percentiles():
    runs = [
        {"duration": 60, "completed": 10, "failed": 0, "total_input_tokens": 810000, "total_output_tokens": 2560,
         "mean_tpot_ms": 40, "p99_tpot_ms": 50, "median_ttft_ms": 900},
        {"duration": 30, "completed": 5, "failed": 1, "total_input_tokens": 405000, "total_output_tokens": 1280,
         "mean_tpot_ms": 46, "p99_tpot_ms": 70, "median_ttft_ms": 800},
    ]
    agg = soak_bench.aggregate_bench(runs)
    assert agg["total_token_throughput"] == pytest.approx((1215000 + 3840) / 90)
    assert agg["output_throughput"] == pytest.approx(3840 / 90)
    assert agg["mean_tpot_ms"] == pytest.approx(42)
    assert agg["p99_tpot_ms"] == 70 and agg["median_ttft_ms"] == 900
    assert (agg["completed"], agg["failed"], agg["runs"]) == (15, 1, 2)
    assert soak_bench.aggregate_bench([]) is None


def test_load_runs_are_sized_to_the_run_length():
    assert soak_bench.next_num_prompts(concurrency=32, input_len=81000, output_len=256, run_s=60) == 64
    # the reference load: ~12.8k tokens/s / 81k = 0.16 req/s -- never fewer than two waves
    assert soak_bench.next_num_prompts(concurrency=32, input_len=81000, output_len=256, run_s=60,
                                 baseline={"total_token_throughput": 12800}) == 64
    assert soak_bench.next_num_prompts(concurrency=4, input_len=200, output_len=50, run_s=60,
                                 last_result={"request_throughput": 3.2}) == 192


def test_a_short_soak_sizes_its_runs_to_finish_within_it(tmp_path):
    """A 6 s soak (the fault tests') with the default 60 s runs would finish none and fail
    'no load run finished': runs last at most a third of the soak."""
    assert soak_bench.run_length_s(60, 3000) == 60  # the reference soak: the run length as set
    assert soak_bench.run_length_s(60, 6) == 2
    started = []

    def popen(cmd, **kwargs):
        started.append(cmd)
        return subprocess.Popen(["true"])

    def prompts(duration_s):
        cfg = SoakConfig(unit="u", state_dir=str(tmp_path / f"s{duration_s}"), duration_s=duration_s, venv="/x",
                         concurrency=4, input_len=256, output_len=32, baseline={"total_token_throughput": 12000},
                         scratch_dir=str(tmp_path / "scratch"))
        load = soak_bench.BenchLoad(cfg, cfg.state_dir, popen=popen)
        load.start()
        load.close()
        return int(started[-1][started[-1].index("--num-prompts") + 1])

    # 12000 / 288 tokens a request = 41.7 requests/s: 60 s runs for a long soak, 2 s for a 6 s one
    assert (prompts(3000), prompts(6)) == (2500, 84)


def test_bench_command_has_the_reference_shape_and_no_key():
    cfg = SoakConfig(unit="vllm@gpu0", state_dir="/s", duration_s=60, venv="/opt/vllm-fleet/releases/r1",
                     model="/models/m", api_key="sekrit")
    cmd = soak_bench.bench_command(cfg, 64, 7, "/s/bench", "run-001.raw.json")
    assert cmd[:3] == ["/opt/vllm-fleet/releases/r1/bin/vllm", "bench", "serve"]
    joined = " ".join(cmd)
    for flag in ("--random-input-len 81000", "--random-output-len 256", "--max-concurrency 32", "--ignore-eos",
                 "--num-prompts 64", "--seed 7", "--model /models/m", "--save-result", "--result-dir /s/bench"):
        assert flag in joined
    assert "sekrit" not in joined


# ------------------------------------------------------------------ statistics

def test_zero_crashes_in_an_hour():
    rate = soak_stats.crash_rate_upper(0, 60)
    assert rate == pytest.approx(-math.log(0.05) / 60)
    assert round(rate, 4) == 0.0499 and rate < 0.04993
    proved = soak_stats.proof(0, 60, 0.95)
    assert proved["mtbf_lower_hours"] == pytest.approx(60 / 2.995732 / 60)
    assert "below 0.04993/min" in proved["statement"] and "95% confidence" in proved["statement"]


def test_target_mtbf_of_8_hours_needs_1438_minutes():
    assert soak_stats.required_minutes(8) == pytest.approx(2.995732 * 480, rel=1e-6)
    short = soak_stats.proof(0, 60, 0.95, target_mtbf_hours=8)
    assert (short["long_enough"], short["required_minutes"], short["remaining_minutes"]) == (False, 1438, 1378)
    assert "needs 1438 min" in short["target_statement"]
    enough = soak_stats.proof(0, 1440, 0.95, target_mtbf_hours=8)
    assert enough["long_enough"] is True and enough["remaining_minutes"] == 0
    crashed = soak_stats.proof(1, 5000, 0.95, target_mtbf_hours=8)
    assert crashed["long_enough"] is False


@pytest.mark.parametrize("k, expected", [(0, 2.995732), (1, 4.743865), (2, 6.295794), (5, 10.51300), (10, 16.96222)])
def test_poisson_upper_bound_matches_the_chi_square_table(k, expected):
    # chi2.ppf(0.95, 2k + 2) / 2
    mu = soak_stats.poisson_upper_mean(k, 0.95)
    assert mu == pytest.approx(expected, rel=1e-5)
    assert soak_stats.poisson_cdf(k, mu) == pytest.approx(0.05, rel=1e-6)


def test_one_crash_bound():
    assert soak_stats.crash_rate_upper(1, 60) == pytest.approx(4.743865 / 60, rel=1e-6)
    assert soak_stats.proof(1, 60)["statement"].startswith("1 crash(es) in 60.0 min")
    assert soak_stats.crash_rate_upper(0, 0) is None
    with pytest.raises(SoakConfigError):
        soak_stats.poisson_upper_mean(0, 1.5)


# ------------------------------------------------------------------ verdict

def passing_monitor(minutes=2):
    monitor = Monitor(MonitorConfig(wedge_window_s=10))
    feed(monitor, [healthy(t, kv=0.40 + t / 100000) for t in range(0, minutes * 60 + 1, 2)])
    return monitor


def test_server_throughput_counts_from_when_the_load_arrives_and_needs_enough_of_it():
    """A short soak (the tests', a rehearsal's) waits seconds for the load generator to start;
    those idle seconds are not the server's throughput (counted from the first sample, this
    engine would read 660 tokens/s, 40% slow)."""
    monitor = Monitor(MonitorConfig(wedge_window_s=10))
    idle = [healthy(t, gen=0, prompt=0, running=0) for t in range(0, 5)]
    loaded = [healthy(t, gen=(t - 4) * 100, prompt=(t - 4) * 1000) for t in range(5, 11)]
    feed(monitor, idle + loaded)
    assert monitor.server_tokens_per_s() == pytest.approx(1100)
    late = Monitor(MonitorConfig(wedge_window_s=10))
    feed(late, idle + loaded[:4])  # 3 s of load: ramp-up, not a figure
    assert late.server_tokens_per_s() is None
    result = soak.verdict(late, elapsed_s=8, duration_s=8, min_duration_s=0, bench_results=[],
                          baseline={"total_token_throughput": 5000})
    # No load run finished: the soak fails for that, not for a throughput read from the ramp-up.
    assert result["reasons"] == ["Load not delivered: no load run finished within the soak: make the soak outlast "
                                 "one run (about run_s seconds after the bench starts)."]
    assert "Not measured, so not judged: total_token_throughput." in result["notes"]


def test_a_passing_verdict_says_what_it_proved():
    monitor = passing_monitor(60)
    result = soak.verdict(monitor, elapsed_s=3600, duration_s=3600, min_duration_s=1800,
                          bench_results=[{"duration": 60, "completed": 10, "total_input_tokens": 810000,
                                          "total_output_tokens": 2560, "output_throughput": 42.7,
                                          "mean_tpot_ms": 41}],
                          baseline={"total_token_throughput": 13000, "mean_tpot_ms": 40, "kv_cache_peak": 0.43},
                          target_mtbf_hours=8, shape={"concurrency": 32})
    assert result["passed"] is True and result["reasons"] == []
    assert result["performance"]["passed"] and result["performance"]["source"] == "bench"
    assert result["tokens_per_s"] == pytest.approx(812560 / 60)
    assert result["proof"]["crash_rate_upper_per_min"] == pytest.approx(0.0499, abs=1e-4)
    assert result["proof"]["required_minutes"] == 1438 and result["proof"]["long_enough"] is False
    assert any("1438 min" in note for note in result["notes"])
    assert result["summary"].startswith("Soak passed: Zero crashes in 60.0 min")
    json.dumps(result)  # it is written as JSON


def test_a_wedged_soak_claims_no_proof():
    """A soak that fails by wedge has no crash, but proves nothing: no MTBF statement,
    long_enough false, and the notes say why."""
    monitor = passing_monitor(600)
    feed(monitor, [healthy(1200 + t, gen=0, prompt=0, kv=0.5) for t in range(0, 200, 2)])
    assert monitor.stop_reason == "wedge" and monitor.crashes == []
    result = soak.verdict(monitor, elapsed_s=30120, duration_s=36000, min_duration_s=1800, bench_results=[],
                          target_mtbf_hours=1, stopped="wedge")
    assert result["passed"] is False
    proved = result["proof"]
    assert proved["statement"] is None and proved["long_enough"] is False and proved["mtbf_lower_hours"] is None
    assert proved["not_proved"] == "The soak failed (wedge): it proves nothing about the crash rate."
    assert "MTBF above" not in json.dumps(result) and "Long enough" not in json.dumps(result)
    assert proved["not_proved"] in result["notes"]
    # Negative control: the same minutes without the wedge are long enough.
    clean = soak.verdict(passing_monitor(600), elapsed_s=30120, duration_s=36000, min_duration_s=1800,
                         bench_results=[real_summary("a_success")], target_mtbf_hours=1)
    assert clean["passed"] and clean["proof"]["long_enough"] is True and "MTBF above" in clean["proof"]["statement"]


@pytest.mark.parametrize("stopped, extra", [("interrupted", {}), ("completed", {"baseline": {"kv_cache_peak": 0.1}})])
def test_every_failed_soak_has_no_proof_statement(stopped, extra):
    result = soak.verdict(passing_monitor(60), elapsed_s=3600, duration_s=3600, min_duration_s=60,
                          bench_results=[], target_mtbf_hours=1, stopped=stopped, **extra)
    assert result["passed"] is False
    assert result["proof"]["statement"] is None and result["proof"]["long_enough"] is False
    assert result["proof"]["not_proved"].startswith("The soak failed (")


def test_the_verdict_keeps_the_bench_throughput_beside_the_recomputed_one():
    runs = [{"duration": 60, "completed": 10, "total_input_tokens": 810000, "total_output_tokens": 2560,
             "total_token_throughput": 13500.0},
            {"duration": 30, "completed": 5, "total_input_tokens": 405000, "total_output_tokens": 1280,
             "total_token_throughput": 12000.0}]
    result = soak.verdict(passing_monitor(60), elapsed_s=3600, duration_s=3600, min_duration_s=60, bench_results=runs,
                          baseline={"total_token_throughput": 13000})
    throughput = result["throughput"]
    assert throughput["gate_used"] == "bench_totals"
    assert throughput["recomputed"] == pytest.approx((1215000 + 3840) / 90) == result["tokens_per_s"]
    assert throughput["reported"] == pytest.approx((13500 * 60 + 12000 * 30) / 90) == result["bench_tokens_per_s"]
    assert result["performance"]["metrics"]["total_token_throughput"]["observed"] == throughput["recomputed"]
    assert any("recomputed from the load runs' token totals" in n and "the bench reported 13,000 tokens/s" in n
               for n in result["notes"])
    # Without the bench's own figure, nothing is invented.
    bare = [{k: v for k, v in r.items() if k != "total_token_throughput"} for r in runs]
    result = soak.verdict(passing_monitor(60), elapsed_s=3600, duration_s=3600, min_duration_s=60, bench_results=bare)
    assert result["throughput"]["reported"] is None and result["bench_tokens_per_s"] is None


def test_a_crash_verdict_fails_with_the_evidence():
    monitor = Monitor()
    feed(monitor, [healthy(0), healthy(2), healthy(4, journal=[CUDA_LINE])])
    monitor.add_bench({"failed": 12, "errors": ["EngineCore encountered an issue"]}, 4)
    result = soak.verdict(monitor, elapsed_s=4, duration_s=3600, min_duration_s=1800, bench_results=[],
                          stopped="crash")
    assert not result["passed"]
    assert len(result["reasons"]) == 1  # the failed requests are the crash's, not another reason
    assert CUDA_LINE in result["reasons"][0]
    assert result["crashes"][0]["evidence"] == CUDA_LINE
    assert not any(k.startswith("_") for k in result["crashes"][0])
    assert result["proof"]["crashes"] == 1 and result["proof"]["statement"] is None
    json.dumps(result)


def test_too_short_slow_or_idle_soaks_fail():
    monitor = passing_monitor(1)
    run = real_summary("a_success")  # 256 + 128 tokens in 0.172 s
    short = soak.verdict(monitor, elapsed_s=60, duration_s=60, min_duration_s=600, bench_results=[run])
    assert not short["passed"] and short["reasons"] == ["The soak ran 60 s, less than the minimum of 600 s."]
    slow = soak.verdict(monitor, elapsed_s=60, duration_s=60, min_duration_s=0, bench_results=[run],
                        baseline={"total_token_throughput": 5000})
    assert not slow["passed"] and slow["performance"]["source"] == "bench"
    assert slow["reasons"] == ["total_token_throughput: 2,232 tokens/s is 55.4% below the baseline 5,000 "
                               "(tolerance 5%)."]
    idle = Monitor()
    feed(idle, [healthy(t, gen=0, prompt=0, running=0) for t in range(0, 20, 2)])
    verdict = soak.verdict(idle, elapsed_s=20, duration_s=20, min_duration_s=0, bench_results=[run])
    assert not verdict["passed"] and verdict["load"]["proof"]["cause"] == "no_request"
    assert verdict["reasons"][0].startswith("Load not delivered: the server saw no request during the soak")
    # Negative control: the same verdicts pass with the minimum met, no baseline and a loaded server.
    assert soak.verdict(monitor, elapsed_s=60, duration_s=60, min_duration_s=0, bench_results=[run])["passed"]


def test_config_validation_says_what_to_change():
    ok = dict(unit="vllm@gpu0", state_dir="/s", duration_s=600, venv="/v")
    SoakConfig(**ok).validate()
    for change, message in [({"min_duration_s": 900}, "shorter than min_duration_s"),
                            ({"sample_interval_s": 30}, "at least every few"),
                            ({"wedge_window_s": 3}, "two samples"),
                            ({"base_url": "127.0.0.1:8000"}, "http://"),
                            ({"confidence": 95}, "0.95 for 95%"),
                            ({"baseline": {"tpot": 1}}, "unknown metric")]:
        with pytest.raises(SoakConfigError, match=message):
            SoakConfig(**{**ok, **change}).validate()


# ------------------------------------------------------------------ status files

def test_read_status_tolerates_a_half_written_line(tmp_path):
    assert soak.read_status(str(tmp_path))["started"] is False
    (tmp_path / "progress.jsonl").write_text(
        json.dumps({"t": 100.0, "pid": os.getpid(), "elapsed_s": 8, "tokens_per_s": 1200.5, "crashes": 0,
                    "wedges": 0, "failed": 0, "phase": "soak"}) + "\n" + '{"t": 102.0, "elap')
    status = soak.read_status(str(tmp_path), now=110.0)
    assert status["progress"]["elapsed_s"] == 8 and status["age_s"] == 10.0
    assert status["running"] is True and status["done"] is False
    (tmp_path / "verdict.json").write_text(json.dumps({"passed": False}))
    assert soak.read_status(str(tmp_path))["passed"] is False


# ------------------------------------------------------------------ the soak loop, faked

class FakeClock:
    def __init__(self):
        self.t = 0.0

    def clock(self):
        return self.t

    def wall(self):
        return 1e9 + self.t

    def sleep(self, seconds):
        self.t += max(seconds, 0.001)


class FakeProbe:
    """A node whose engine dies at `crash_at` (503 first, the CUDA line one tick later) or
    wedges at `wedge_at`; it makes progress otherwise."""

    def __init__(self, clock, crash_at=None, wedge_at=None):
        self.clock, self.crash_at, self.wedge_at = clock, crash_at, wedge_at
        self.cpu_children_s = 0.0
        self.journal_calls = 0
        self.pending: list[JournalLine] = []

    def systemd(self):
        return {"LoadState": "loaded", "ActiveState": "active", "MainPID": "412", "NRestarts": "0"}

    def http_get(self, path):
        return 200, "", None

    def start_journal(self, since):
        pass

    def journal(self):
        self.journal_calls += 1
        lines, self.pending = self.pending, []
        return lines

    def sample(self, elapsed):
        t = elapsed
        gen = t * 100
        if self.wedge_at is not None and t >= self.wedge_at:
            gen = self.wedge_at * 100
            return healthy(t, gen=gen, prompt=self.wedge_at * 1000, kv=0.5)
        sample = healthy(t, gen=gen, kv=0.3)
        if self.crash_at is not None and t >= self.crash_at:
            sample.health = 503
            self.pending.append(JournalLine(1e9 + self.crash_at, CUDA_LINE))
        return sample


class FakeLoad:
    def __init__(self, run_s=10):
        self.run_s = run_s
        self.results, self.failures = [], []
        self.consecutive_errors = 0
        self.started, self.stopped = 0, False
        self._left = None

    def start(self):
        self.started += 1
        self._left = self.run_s

    @property
    def running(self):
        return self._left is not None

    def poll(self):
        if self._left is None:
            return None
        self._left -= 1
        if self._left > 0:
            return None
        self._left = None
        result = {"duration": 10.0, "completed": 20, "failed": 0, "total_input_tokens": 20000,
                  "total_output_tokens": 2000, "mean_tpot_ms": 30.0}
        self.results.append(result)
        return result

    def stop(self):
        self.stopped = True
        self._left = None

    close = stop


def run_fake(tmp_path, probe_kwargs=None, **cfg):
    clock = FakeClock()
    probe = FakeProbe(clock, **(probe_kwargs or {}))
    load = FakeLoad()
    config = SoakConfig(**{"unit": "vllm@gpu0", "state_dir": str(tmp_path / "soak"), "duration_s": 120,
                           "min_duration_s": 60, "venv": "/v", "sample_interval_s": 2, "wedge_window_s": 10,
                           "concurrency": 4, **cfg})
    result = soak.run_soak(config, probe=probe, load=load, clock=clock.clock, sleep=clock.sleep, wall=clock.wall)
    progress = [json.loads(line) for line in (tmp_path / "soak" / "progress.jsonl").read_text().splitlines()]
    return result, progress, load, probe, clock


def test_the_soak_runs_its_duration_and_writes_progress_and_verdict(tmp_path):
    result, progress, load, _, clock = run_fake(tmp_path, target_mtbf_hours=8,
                                                baseline={"total_token_throughput": 2000})
    assert result["passed"], result["reasons"]
    assert result["duration_s"] == pytest.approx(120)
    assert clock.t == pytest.approx(120, abs=0.1)
    assert load.stopped and load.started >= 6
    assert json.loads((tmp_path / "soak" / "verdict.json").read_text()) == result
    soak_lines = [p for p in progress if p["phase"] == "soak"]
    assert len(soak_lines) == 61  # one every 2 s, the first at 0 s
    assert max(b["t"] - a["t"] for a, b in zip(soak_lines, soak_lines[1:])) <= 30
    assert {"elapsed_s", "tokens_per_s", "crashes", "wedges", "failed"} <= set(soak_lines[-1])
    assert progress[-1]["phase"] == "done" and progress[-1]["passed"] is True
    assert result["performance"]["metrics"]["total_token_throughput"]["observed"] == pytest.approx(2200)
    assert result["proof"]["required_minutes"] == 1438


def test_the_soak_stops_at_the_first_crash_and_waits_for_the_cuda_line(tmp_path):
    result, progress, load, probe, clock = run_fake(tmp_path, {"crash_at": 13.0})
    assert not result["passed"] and result["stopped"] == "crash"
    assert result["duration_s"] == pytest.approx(14)  # the first tick after the crash
    assert clock.t < 20  # not the 120 s soak
    assert load.stopped
    [crash] = result["crashes"]
    assert crash["evidence"] == CUDA_LINE and crash["detection_latency_s"] == pytest.approx(1)
    assert progress[-1]["phase"] == "done" and progress[-2]["crashes"] == 1


def test_the_soak_stops_at_a_wedge(tmp_path):
    result, _, load, _, clock = run_fake(tmp_path, {"wedge_at": 30.0})
    assert result["stopped"] == "wedge" and not result["passed"]
    assert result["wedges"][0]["since_elapsed_s"] == pytest.approx(30)
    assert 40 <= result["duration_s"] <= 42 and load.stopped


def test_a_state_dir_is_used_once_and_a_missing_unit_is_named(tmp_path):
    run_fake(tmp_path, duration_s=4, min_duration_s=0)
    with pytest.raises(SoakError, match="already holds"):
        run_fake(tmp_path, duration_s=4, min_duration_s=0)

    class NoUnit(FakeProbe):
        def systemd(self):
            return {"LoadState": "not-found"}

    clock = FakeClock()
    with pytest.raises(SoakError, match="vllm@gpu9 is not loaded"):
        soak.run_soak(SoakConfig(unit="vllm@gpu9", state_dir=str(tmp_path / "other"), duration_s=4, venv="/v"),
                      probe=NoUnit(clock), load=FakeLoad(), clock=clock.clock, sleep=clock.sleep, wall=clock.wall)


# ------------------------------------------------------------------ BenchLoad, replaying the real bench

# A `vllm` that replays one captured case of the real bench (REPLAY_CASE, a directory of
# tests/fixtures/vllm_bench_real): its output, its result file where it saved one, its exit
# status. REPLAY_PLANT: instead of a result, plant a symlink to that path (a hostile bench).
# REPLAY_EXIT: another exit status (composed: no captured case exits non-zero after a run).
REPLAY_VLLM = """#!{python}
import json, os, shutil, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
case = os.environ["REPLAY_CASE"]
with open(os.path.join(case, "run.json")) as handle:
    run = json.load(handle)
with open(os.path.join(case, "output.log")) as handle:
    sys.stdout.write(handle.read())
result = os.path.join(value("--result-dir"), value("--result-filename"))
if os.environ.get("REPLAY_PLANT"):
    os.symlink(os.environ["REPLAY_PLANT"], result)
elif run["result_saved"]:
    shutil.copy(os.path.join(case, "result.json"), result)
with open(os.environ["REPLAY_SEEN"], "w") as handle:
    json.dump({{"argv": args, "key": os.environ.get("OPENAI_API_KEY"), "cwd": os.getcwd()}}, handle)
sys.exit(int(os.environ.get("REPLAY_EXIT", run["exit_status"])))
"""


@pytest.fixture
def replay_venv(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "vllm"
    script.write_text(REPLAY_VLLM.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("REPLAY_SEEN", str(tmp_path / "seen.json"))
    return venv


def wait_poll(load, timeout=10):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = load.poll()
        if result is not None or not load.running:
            return result
        time.sleep(0.05)
    raise AssertionError("the replayed bench did not finish")


def replay(tmp_path, venv, monkeypatch, case, **cfg):
    """One BenchLoad run of a captured case, configured as the role configures the soak."""
    monkeypatch.setenv("REPLAY_CASE", str(REAL_BENCH / case))
    config = SoakConfig(**{"unit": "vllm@gpu0", "state_dir": str(tmp_path / "s"), "duration_s": 10,
                           "venv": str(venv), "concurrency": 4, "input_len": 32, "output_len": 16,
                           "model": "/models/qwen3.6-35b-a3b-fp8", "served_model_name": "qwen-test",
                           "api_key": "sekrit", "scratch_dir": str(tmp_path / "scratch"), **cfg})
    load = soak_bench.BenchLoad(config, config.state_dir)
    load.start()
    return load, wait_poll(load)


def loaded_monitor(concurrency=4, running=4):
    """A server that ran `running` requests and generated tokens at every sample for two minutes."""
    monitor = Monitor(MonitorConfig(wedge_window_s=10, concurrency=concurrency))
    feed(monitor, [healthy(t, running=running) for t in range(0, 121, 2)])
    return monitor


def idle_monitor(concurrency=4):
    monitor = Monitor(MonitorConfig(wedge_window_s=10, concurrency=concurrency))
    feed(monitor, [healthy(t, gen=0, prompt=0, running=0) for t in range(0, 21, 2)])
    return monitor


def real_summary(case):
    return soak_bench.bench_summary(json.loads((REAL_BENCH / case / "result.json").read_text()))


@pytest.mark.parametrize("case", ["a_success", "b_save_detailed"])
def test_a_real_bench_run_is_read_kept_and_passes_the_gate(tmp_path, replay_venv, monkeypatch, case):
    load, summary = replay(tmp_path, replay_venv, monkeypatch, case)
    assert load.failures == [] and load.results == [summary]
    assert (summary["completed"], summary["failed"], summary["run"]) == (8, 0, "run-001")
    assert summary["total_token_throughput"] > 0 and summary["p99_itl_ms"] > 0
    saved = json.loads((tmp_path / "s" / "bench" / "run-001.json").read_text())
    assert saved == summary and not {"ttfts", "itls", "generated_texts", "errors", "start_times"} & set(saved)
    assert "Serving Benchmark Result" in (tmp_path / "s" / "bench" / "run-001.log").read_text()
    seen = json.loads((tmp_path / "seen.json").read_text())
    # The bench saved into the scratch directory, not the soak's state_dir; the key only in its env.
    assert seen["argv"][seen["argv"].index("--result-dir") + 1] == load.scratch == seen["cwd"]
    assert os.path.dirname(load.scratch) == str(tmp_path / "scratch") and "--save-detailed" not in seen["argv"]
    assert seen["key"] == "sekrit" and "sekrit" not in json.dumps(seen["argv"])
    assert os.listdir(load.scratch) == []  # the raw result was read and removed
    result = soak.verdict(loaded_monitor(), elapsed_s=120, duration_s=120, min_duration_s=60,
                          bench_results=load.results, load_failures=load.failures)
    assert result["passed"], result["reasons"]
    assert result["load"]["runs"] == 1 and result["bench_tokens_per_s"] == summary["total_token_throughput"]
    assert result["load"]["proof"]["delivered"] and result["load"]["proof"]["requests_completed"] == 8
    scratch = load.scratch
    load.close()
    assert not os.path.exists(scratch)


# case, cause, what the gate's reason says (after "Load not delivered: no load run completed a request (1 run(s)
# failed); ")
CAUSES = [
    ("c_wrong_api_key", "unauthorized", "unauthorised: the server refused the load generator's API key (401 "
                                        "Unauthorized)"),
    ("c_wrong_api_key_detailed", "unauthorized", "unauthorised: "),
    ("d_wrong_model", "wrong_model", "wrong model name: the server does not serve the model name the load generator "
                                     "asked for (qwen-test; 404 Not Found)"),
    ("d_wrong_model_detailed", "wrong_model", "wrong model name: "),
    ("e_no_tokenizer", "no_tokenizer", "no tokenizer: the load generator could not load its tokenizer "
                                       "(/models/qwen3.6-35b-a3b-fp8)"),
    ("e_unreadable_tokenizer", "no_tokenizer", "no tokenizer: "),
    ("f_nothing_listening", "could_not_connect", "could not connect: the load generator could not connect to "
                                                 "http://127.0.0.1:8000"),
    ("f_nothing_listening_detailed", "could_not_connect", "could not connect: "),
]
# What each case's message quotes of the real output.
EVIDENCE = {"unauthorized": "(8 request(s) failed: 8 x Unauthorized)", "wrong_model": "8 x Not Found",
            "could_not_connect": "8 x aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host",
            "no_tokenizer": "vllm bench serve exited 1 and it saved no result: "}


@pytest.mark.parametrize("case, cause, words", CAUSES)
def test_each_cause_of_no_load_is_read_from_the_real_bench_and_fails_the_gate(tmp_path, replay_venv, monkeypatch,
                                                                             case, cause, words):
    load, summary = replay(tmp_path, replay_venv, monkeypatch, case)
    assert summary is None and load.results == [] and load.consecutive_errors == 1
    [failure] = load.failures
    assert (failure["run"], failure["cause"]) == ("run-001", cause)
    assert failure["message"].startswith(words) and EVIDENCE[cause] in failure["message"], failure["message"]
    result = soak.verdict(idle_monitor(), elapsed_s=20, duration_s=120, min_duration_s=10, bench_results=load.results,
                          load_failures=load.failures, stopped="load_error")
    assert result["passed"] is False and result["load"]["runs"] == 0 and result["bench_tokens_per_s"] is None
    assert result["reasons"][0].startswith("Load not delivered: no load run completed a request (1 run(s) failed); "
                                           + words)
    assert result["summary"].startswith("Soak failed after 20.0 s: Load not delivered: ")
    assert result["load"]["proof"]["cause"] == cause and result["load"]["proof"]["failed_runs"] == load.failures


def test_the_tail_of_the_log_names_an_unknown_cause(tmp_path, replay_venv, monkeypatch):
    """Composed from a captured case: a_success's output and result with exit status 1."""
    monkeypatch.setenv("REPLAY_EXIT", "1")
    load, summary = replay(tmp_path, replay_venv, monkeypatch, "a_success", num_prompts=8)
    assert summary is None
    [failure] = load.failures
    assert failure["cause"] == "unknown"
    assert failure["message"].startswith("cause unknown: vllm bench serve exited 1 after 8 completed and 0 failed; "
                                         "last output: ---------------Inter-token Latency----------------")
    assert failure["message"].endswith("P99 ITL (ms):                            7.07 | " + "=" * 50)


def test_a_missing_tokenizer_is_named_by_its_path_in_the_last_line_too():
    """Composed from e_no_tokenizer: only its last line, the exception naming the path (a bench whose
    traceback passes no get_tokenizer frame, as the stand-in's)."""
    last = (REAL_BENCH / "e_no_tokenizer" / "output.log").read_text().strip().splitlines()[-1]
    model = json.loads((REAL_BENCH / "e_no_tokenizer" / "run.json").read_text())["argv"][-3]
    assert model in last and "get_tokenizer" not in last

    def cause(model_path):
        cfg = SoakConfig(unit="u", state_dir="/s", duration_s=1, venv="/v", model=model_path)
        return soak_bench.diagnose(f"Traceback (most recent call last):\n{last}\n", rc=1, result=None,
                                   result_problem="it saved no result", cfg=cfg)["cause"]

    assert cause(model) == "no_tokenizer"
    assert cause("/models/another") == "unknown"  # negative control: not the soak's tokenizer


def test_a_result_planted_as_a_symlink_is_refused_and_never_followed(tmp_path, replay_venv, monkeypatch):
    """The bench (as the probe user) leaves a symlink where its result belongs, pointing at a
    root-only file: root neither reads nor keeps what it points at, and removes only the link."""
    secret = tmp_path / "root-only.json"
    secret.write_text(json.dumps({"completed": 987654, "duration": 1.0, "total_input_tokens": 1, "token": "s3cr3t"}))
    secret.chmod(0o600)
    monkeypatch.setenv("REPLAY_PLANT", str(secret))
    load, summary = replay(tmp_path, replay_venv, monkeypatch, "a_success")
    assert summary is None and load.results == []
    [failure] = load.failures
    assert "run-001.raw.json is a symbolic link: refused, not followed" in failure["message"]
    kept = json.dumps(load.failures) + "".join(p.read_text() for p in (tmp_path / "s" / "bench").iterdir())
    assert "s3cr3t" not in kept and "987654" not in kept
    assert json.loads(secret.read_text())["token"] == "s3cr3t"  # the target is untouched
    assert os.listdir(load.scratch) == []  # the link itself is gone
    # Negative control: the same file, not a link, is read.
    (tmp_path / "plain.json").write_text(secret.read_text())
    assert soak_bench.read_result(str(tmp_path / "plain.json"))[0]["token"] == "s3cr3t"


def test_untrusted_files_are_read_only_as_one_small_regular_file(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert soak_bench.read_result(str(fifo)) == (None, f"{fifo} is not a regular file: refused")  # and no hang
    (tmp_path / "shadow").write_text("{}")
    os.link(tmp_path / "shadow", tmp_path / "hard.json")
    assert soak_bench.read_result(str(tmp_path / "hard.json"))[1].endswith("has 2 links: refused (a hard link to "
                                                                          "another file)")
    (tmp_path / "big.json").write_bytes(b" " * (soak_bench.RESULT_MAX_BYTES + 1) + b"{}")
    assert "more than the 1048576 a result may be" in soak_bench.read_result(str(tmp_path / "big.json"))[1]
    assert soak_bench.read_result(str(tmp_path / "none.json")) == (None, "it saved no result")
    # A log is read by its tail, under the same rules.
    (tmp_path / "log").write_bytes(b"x" * 100 + b"tail")
    assert soak_bench.read_untrusted(str(tmp_path / "log"), 4, tail=True) == b"tail"
    (tmp_path / "log-link").symlink_to(tmp_path / "log")
    with pytest.raises(soak_bench.RefusedFile, match="symbolic link"):
        soak_bench.read_untrusted(str(tmp_path / "log-link"), 4, tail=True)


def test_the_scratch_directory_is_new_private_and_the_probe_users(tmp_path, monkeypatch):
    chowned = []
    monkeypatch.setattr(soak_bench.os, "chown", lambda path, uid, gid: chowned.append((path, uid, gid)))
    parent = tmp_path / "run" / "vllm-fleet-soak"
    first = soak_bench.make_scratch(str(parent), "20261207T180000Z-gpu0", {"user": 4242, "group": 4343})
    second = soak_bench.make_scratch(str(parent), "20261207T180000Z-gpu0", {})
    assert first != second and os.path.dirname(first) == str(parent)
    assert os.path.basename(first).startswith("20261207T180000Z-gpu0-")
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o700 and stat.S_IMODE(os.stat(parent).st_mode) == 0o711
    assert chowned == [(first, 4242, 4343)]
    # A parent someone else could swap the directory in is refused.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SoakConfigError, match="not a symlink and not writable by group or others"):
        soak_bench.make_scratch(str(tmp_path / "link"), "x", {})
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(SoakConfigError, match="scratch_dir .*/open must be a directory"):
        soak_bench.make_scratch(str(tmp_path / "open"), "x", {})


def test_the_bench_runs_as_the_probe_user_with_its_own_home(tmp_path, monkeypatch):
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils import identity

    monkeypatch.setattr(identity.os, "geteuid", lambda: 0)
    monkeypatch.setattr(identity.pwd, "getpwnam", lambda name: identity.pwd.struct_passwd(
        ("prober", "x", 4242, 4343, "", "/nonexistent", "/usr/sbin/nologin")))
    made = []

    def make_scratch(parent, name, identity):  # (tested above) as a real root would, chown and all
        made.append((parent, name, identity))
        return tempfile.mkdtemp(dir=tmp_path)

    monkeypatch.setattr(soak_bench, "make_scratch", make_scratch)
    started = []

    def popen(cmd, **kwargs):
        started.append(kwargs)
        return subprocess.Popen(["true"])

    cfg = SoakConfig(unit="u", state_dir=str(tmp_path / "s"), duration_s=10, venv="/x", run_as="prober",
                     scratch_dir=str(tmp_path / "scratch"))
    load = soak_bench.BenchLoad(cfg, cfg.state_dir, popen=popen)
    load.start()
    kwargs = started[0]
    assert made == [(str(tmp_path / "scratch"), "s", {"user": 4242, "group": 4343, "extra_groups": []})]
    assert (kwargs["user"], kwargs["group"], kwargs["extra_groups"]) == (4242, 4343, [])
    assert kwargs["env"]["HOME"] == kwargs["cwd"] == load.scratch  # not root's HOME
    # the log is root's own, in the soak's state_dir, opened before the bench ran
    assert os.path.exists(tmp_path / "s" / "bench" / "run-001.log")
    load.close()


def test_the_tokenizer_is_checked_as_the_probe_user_before_any_load(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    calls = []

    def run(cmd, **kwargs):
        calls.append(kwargs)
        return subprocess.run(cmd, **kwargs)

    def check(**cfg):
        return soak_bench.check_tokenizer(SoakConfig(unit="u", state_dir="/s", duration_s=1, venv="/v", **cfg), run)

    assert check(model=str(model)) is None
    assert check(model=str(tmp_path / "nope")) == {
        "cause": "no_tokenizer",
        "message": f"no tokenizer: the load generator (vllm bench serve) loads its tokenizer from {tmp_path}/nope "
                   f"and the soak's user cannot read it (reading {tmp_path}/nope as the soak's user failed (exit "
                   f"status 1): FileNotFoundError: [Errno 2] No such file or directory: '{tmp_path}/nope'): make it "
                   "readable by the soak's user, or name a readable tokenizer directory (tokenizer)"}
    (model / "tokenizer.json").unlink()
    assert "no tokenizer file (tokenizer.json, tokenizer_config.json" in check(model=str(model))["message"]
    (model / "tokenizer.json").write_text("{}")
    (model / "tokenizer.json").chmod(0)
    if os.geteuid() != 0:  # root reads a file of mode 0 anyway
        assert "Permission denied" in check(model=str(model))["message"]
    # --tokenizer wins over the model path; a hub name or no model is not a local path to check
    assert check(model=str(tmp_path / "nope"), tokenizer=str(model)) is None
    assert check(model="Qwen/Qwen3.6-35B-A3B") is None and check() is None
    assert calls and not any("user" in kwargs for kwargs in calls)  # no run_as: as the soak's own user


def test_the_tokenizer_check_runs_as_the_probe_user(tmp_path, monkeypatch):
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils import identity

    monkeypatch.setattr(identity.os, "geteuid", lambda: 0)
    monkeypatch.setattr(identity.pwd, "getpwnam", lambda name: identity.pwd.struct_passwd(
        ("prober", "x", 4242, 4343, "", "/nonexistent", "/usr/sbin/nologin")))
    calls = []

    def run(cmd, **kwargs):
        calls.append({k: kwargs.pop(k) for k in ("user", "group", "extra_groups")})
        return subprocess.CompletedProcess(cmd, 1, "", "PermissionError: [Errno 13] Permission denied: '/models/m'")

    cfg = SoakConfig(unit="u", state_dir="/s", duration_s=1, venv="/v", model="/models/m", run_as="prober")
    assert soak_bench.check_tokenizer(cfg, run)["message"] == (
        "no tokenizer: the load generator (vllm bench serve) loads its tokenizer from /models/m and user prober "
        "cannot read it (reading /models/m as user prober failed (exit status 1): PermissionError: [Errno 13] "
        "Permission denied: '/models/m'): make it readable by user prober, or name a readable tokenizer directory "
        "(tokenizer)")
    assert calls == [{"user": 4242, "group": 4343, "extra_groups": []}]


def test_a_tokenizer_the_probe_user_cannot_read_fails_the_soak_before_any_load(tmp_path, replay_venv, monkeypatch):
    monkeypatch.setenv("REPLAY_CASE", str(REAL_BENCH / "a_success"))

    def soak_with(model, run):
        clock = FakeClock()
        config = SoakConfig(unit="vllm@gpu0", state_dir=str(tmp_path / run), duration_s=4, venv=str(replay_venv),
                            model=model, concurrency=4, scratch_dir=str(tmp_path / "scratch"))
        return soak.run_soak(config, probe=FakeProbe(clock), clock=clock.clock, sleep=clock.sleep, wall=clock.wall)

    result = soak_with(str(tmp_path / "missing-model"), "refused")
    assert result["passed"] is False and result["stopped"] == "load_error" and result["duration_s"] == 0
    assert result["reasons"] == [
        f"Load not delivered: no tokenizer: the load generator (vllm bench serve) loads its tokenizer from "
        f"{tmp_path}/missing-model and the soak's user cannot read it (reading {tmp_path}/missing-model as the "
        f"soak's user failed (exit status 1): FileNotFoundError: [Errno 2] No such file or directory: "
        f"'{tmp_path}/missing-model'): make it readable by the soak's user, or name a readable tokenizer directory "
        "(tokenizer)."]
    assert result["load"]["proof"]["cause"] == "no_tokenizer" and result["monitor"]["samples"] == 0
    assert not (tmp_path / "refused" / "bench").exists() and not (tmp_path / "seen.json").exists()  # no bench ran
    # Negative control: with a tokenizer it can read, the soak loads the server.
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    loaded = soak_with(str(model), "loaded")
    assert loaded["monitor"]["samples"] > 0 and (tmp_path / "loaded" / "bench" / "run-001.log").exists()
    assert loaded["load"]["proof"]["cause"] != "no_tokenizer"


def test_the_servers_counters_must_show_the_load(tmp_path):
    """Runs completed, yet the server's counters tell whether the soak loaded it as configured."""
    run = [real_summary("a_success")]

    def judge(monitor):
        return soak.verdict(monitor, elapsed_s=120, duration_s=120, min_duration_s=60, bench_results=run)

    good = judge(loaded_monitor(concurrency=32, running=24))  # 75% of 32, rounded up
    assert good["passed"] and good["load"]["proof"]["server"]["concurrent_samples"] == 61
    low = judge(loaded_monitor(concurrency=32, running=23))
    assert low["load"]["proof"]["cause"] == "concurrency_not_reached"
    assert low["reasons"] == [
        "Load not delivered: vllm:num_requests_running never reached 24 (75% of the concurrency 32; peak 23 over 61 "
        "samples with requests running): the server's max-num-seqs or KV cache may be below the load."]
    # Tokens generated in fewer than half of the samples after the load arrived (every third here).
    sparse = Monitor(MonitorConfig(wedge_window_s=1000, concurrency=4))
    feed(sparse, [healthy(t, gen=(t // 6) * 100) for t in range(0, 121, 2)])
    slow = judge(sparse)
    assert slow["load"]["proof"]["cause"] == "not_generating"
    assert "the server generated tokens in 20 of the 61 samples after the load arrived, fewer than 50%" in \
        slow["reasons"][0]
    # The load arrives late (the bench starting): the seconds before it are not counted.
    late = Monitor(MonitorConfig(wedge_window_s=10, concurrency=4))
    feed(late, [healthy(t, gen=0, prompt=0, running=0) for t in range(0, 30, 2)]
         + [healthy(t, gen=(t - 28) * 100) for t in range(30, 121, 2)])
    assert judge(late)["passed"] and judge(late)["load"]["proof"]["server"]["arrived_elapsed_s"] == 30
    # No vllm:* series at all (a server started with --disable-log-stats): the load cannot be seen.
    blind = Monitor(MonitorConfig(wedge_window_s=10, concurrency=4))
    feed(blind, [Sample.from_observations(t, health=200, metrics_text="process_start_time_seconds 1\n")
                 for t in range(0, 121, 2)])
    assert blind.stop_reason is None  # nothing read: not "incomplete"
    assert judge(blind)["load"]["proof"]["cause"] == "no_metrics"
    assert "the server exported no vllm:* metrics" in judge(blind)["reasons"][0]


# ------------------------------------------------------------------ the thin modules, through Ansible

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Plan in check mode
      vllm_fleet.fleet.soak:
        unit: vllm@gpu0
        venv: /opt/vllm-fleet/releases/r1
        model: /models/m
        duration_s: 3000
        min_duration_s: 1800
        api_key: sekrit
        state_dir: "{{ state_dir }}/plan"
      check_mode: true
      register: plan

    - name: A soak that could never pass
      vllm_fleet.fleet.soak:
        unit: vllm@gpu0
        venv: /opt/vllm-fleet/releases/r1
        duration_s: 60
        min_duration_s: 600
        state_dir: "{{ state_dir }}/bad"
      register: bad
      ignore_errors: true

    - name: Status of a finished soak
      vllm_fleet.fleet.soak_status:
        state_dir: "{{ state_dir }}/done"
        wait_s: 5
      register: status

    - name: Save
      ansible.builtin.copy:
        content: "{{ {'plan': plan, 'bad': bad, 'status': status} | to_json }}"
        dest: "{{ state_dir }}/results.json"
        mode: "0600"
"""


def test_modules_through_ansible(tmp_path):
    import time

    (tmp_path / "playbook.yml").write_text(PLAYBOOK)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "progress.jsonl").write_text(json.dumps({"t": 1.0, "pid": 999999999, "elapsed_s": 7}) + "\n")
    (tmp_path / "done" / "verdict.json").write_text(json.dumps({"passed": True, "summary": "ok"}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"))
    started = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"state_dir={tmp_path}", "-e", f"ansible_python_interpreter={sys.executable}",
                           str(tmp_path / "playbook.yml")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    plan = results["plan"]["soak"]["plan"]
    assert plan["load_command"][:3] == ["/opt/vllm-fleet/releases/r1/bin/vllm", "bench", "serve"]
    assert "sekrit" not in json.dumps(results["plan"]) and "sekrit" not in proc.stdout
    assert not (tmp_path / "plan").exists()  # check mode wrote nothing
    assert results["bad"]["failed"] and "shorter than min_duration_s" in results["bad"]["msg"]
    status = results["status"]
    assert status["done"] is True and status["passed"] is True and status["progress"]["elapsed_s"] == 7
    assert time.monotonic() - started < 60  # the finished soak did not make soak_status wait


@pytest.mark.parametrize("baseline, message", [
    ("12.8k", "profile.baseline must be a mapping of metric name to number, got a string '12.8k'"),
    ({"total_token_throughput": "12.8k"}, "profile.baseline.total_token_throughput must be a number > 0, got '12.8k'"),
])
def test_a_profile_baseline_of_the_wrong_type_is_refused_with_the_profile(baseline, message):
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils import serve_config

    schema = yaml.safe_load((ROOT / "catalogue" / "vllm_serve_args.yml").read_text())
    profile = yaml.safe_load((ROOT / "profiles" / "qwen3.6-35b-a3b-fp8.yml").read_text())
    serve_config.build(schema, profile)  # the shipped one, baseline and all, is fine
    with pytest.raises(serve_config.ProfileError, match=message):
        serve_config.build(schema, {**profile, "baseline": baseline})
