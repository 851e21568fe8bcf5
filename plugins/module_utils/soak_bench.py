"""The soak's load: ``vllm bench serve`` from the release venv, run after run (``BenchLoad``),
each run sized to last about ``run_s`` and kept as a summary, and one set of numbers for all
runs (``aggregate_bench``) for the gate to judge.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.identity import as_user

if TYPE_CHECKING:  # the runner's config; soak imports this module
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import SoakConfig

# The reference load of the story: 32 concurrent clients, ~81k tokens in, 256 out.
REFERENCE_CONCURRENCY = 32
REFERENCE_INPUT_LEN = 81000
REFERENCE_OUTPUT_LEN = 256

BENCH_DIR = "bench"
THROUGHPUT_KEYS = ("total_token_throughput", "output_throughput", "request_throughput")

# Keys of one `vllm bench serve` result kept in the soak's record (the per-request arrays
# -- input_lens, ttfts, itls, generated_texts, ... -- run to megabytes and are dropped).
BENCH_SUMMARY_KEYS = ("date", "model_id", "num_prompts", "max_concurrency", "duration", "completed", "failed",
                      "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                      "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests")


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
        identity = as_user(self.cfg.run_as)  # checked by SoakConfig.validate
        os.makedirs(self.dir, exist_ok=True)
        if identity:  # the bench writes its results here
            os.chown(self.dir, identity["user"], identity["group"])
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
                                    env=self.env(), close_fds=True, **identity)
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
