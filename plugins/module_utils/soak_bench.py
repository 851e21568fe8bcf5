"""The soak's load: ``vllm bench serve`` from the release venv, run after run (``BenchLoad``),
each run sized to last about ``run_s`` and kept as a summary, and one set of numbers for all
runs (``aggregate_bench``) for the gate to judge.

The bench is the release's code, run as the probe user (``run_as``): it writes its result into
a scratch directory of its own outside the release tree (``make_scratch``), and root reads it
back as a file that user could have planted (``read_untrusted``: no symlink followed, no FIFO
waited on, a regular file of one link, a size cap). Root keeps the summary and the run's log
in the soak's own ``state_dir/bench``. A run that completed no request did not load the
server: ``diagnose`` names why from the real bench's output (its log: the result file of
0.25.1 carries no per-request errors without ``--save-detailed``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.identity import as_user, last_line, run_probe
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import SoakConfigError

if TYPE_CHECKING:  # the runner's config; soak imports this module
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import SoakConfig

# The reference load of the story: 32 concurrent clients, ~81k tokens in, 256 out.
REFERENCE_CONCURRENCY = 32
REFERENCE_INPUT_LEN = 81000
REFERENCE_OUTPUT_LEN = 256

BENCH_DIR = "bench"
# A soak proves its load by runs that finished (soak.load_proof): a run lasts at most this
# fraction of the soak, so that a short soak still sees two finish before it stops the third.
RUN_SHARE_OF_SOAK = 1 / 3
THROUGHPUT_KEYS = ("total_token_throughput", "output_throughput", "request_throughput")

# Keys of one `vllm bench serve` result kept in the soak's record (the per-request arrays
# -- input_lens, ttfts, itls, generated_texts, ... -- run to megabytes and are dropped).
BENCH_SUMMARY_KEYS = ("date", "model_id", "num_prompts", "max_concurrency", "duration", "completed", "failed",
                      "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                      "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests")

# Root's own directory (made 0711) under which each soak gets its scratch directory: outside the
# release tree, on tmpfs (nothing in it outlives a boot).
DEFAULT_SCRATCH_DIR = "/run/vllm-fleet-soak"
# Without --save-detailed the real result is about 1 KB (tests/fixtures/vllm_bench_real/a_success):
# anything near this cap is not a result.
RESULT_MAX_BYTES = 1 << 20
# The end of a run's log root reads: the failed requests' errors and the result table are last.
LOG_TAIL_BYTES = 64 << 10


# --------------------------------------------------------------------------- files the bench writes

class RefusedFile(OSError):
    """A file the probe user controls that root will not read: the message says why."""


def read_untrusted(path: str, max_bytes: int, *, tail: bool = False) -> bytes:
    """The bytes of a file another user could have put there, read by root without trusting it.

    Opened with O_NOFOLLOW (a symlink is refused, never followed) and O_NONBLOCK (a FIFO does
    not hang the soak); the opened descriptor must be a regular file with one link (a hard
    link to a file of root's is refused). At most ``max_bytes``: a bigger file is refused,
    or with ``tail`` only its last ``max_bytes`` are read. Raises RefusedFile, or OSError
    (FileNotFoundError when there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise RefusedFile(f"{path} is a symbolic link: refused, not followed") from None
        raise exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(f"{path} is not a regular file: refused")
        if info.st_nlink != 1:
            raise RefusedFile(f"{path} has {info.st_nlink} links: refused (a hard link to another file)")
        if info.st_size > max_bytes:
            if not tail:
                raise RefusedFile(f"{path} is {info.st_size} bytes, more than the {max_bytes} a result may be")
            os.lseek(fd, info.st_size - max_bytes, os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_result(path: str) -> tuple[dict | None, str | None]:
    """(the run's result, None) or (None, why there is none)."""
    try:
        value = json.loads(read_untrusted(path, RESULT_MAX_BYTES))
    except FileNotFoundError:
        return None, "it saved no result"
    except RefusedFile as exc:
        return None, str(exc)
    except (OSError, ValueError) as exc:
        return None, f"its result could not be read: {exc}"
    if not isinstance(value, dict):
        return None, "its result is not a JSON object"
    return value, None


def make_scratch(parent: str, name: str, identity: dict) -> str:
    """A new directory for one soak's bench output, outside the release tree: mode 0700, the
    probe user's. ``parent`` is root's own (made 0711 when missing); one that is a symlink,
    not the caller's or writable by others is refused, so no one else can swap the directory."""
    os.makedirs(parent, mode=0o711, exist_ok=True)
    info = os.lstat(parent)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SoakConfigError(f"scratch_dir {parent} must be a directory of uid {os.geteuid()}'s, not a symlink "
                              "and not writable by group or others: the load generator's results are read from "
                              "under it")
    path = tempfile.mkdtemp(prefix=f"{name}-", dir=parent)  # 0700, a name no one else chose
    if identity:
        os.chown(path, identity["user"], identity["group"])
    return path


# --------------------------------------------------------------------------- why a run delivered no load

# How the real 0.25.1 bench says why no request completed (tests/fixtures/vllm_bench_real,
# captured): a request's error is the HTTP reason of its answer (401 "Unauthorized": a wrong
# key; 404 "Not Found": a model the server does not serve, entrypoints/openai/models/serving.py)
# or a traceback ending in aiohttp's ClientConnectorError; a tokenizer that cannot be loaded
# ends the bench (exit 1, no result) with a traceback through vllm/tokenizers' get_tokenizer.
_ERROR_LINE = re.compile(r"^Error \d+: (.*)$")
_REQUEST_CAUSES = (("unauthorized", re.compile(r"^\d+ x Unauthorized$", re.M)),
                   ("wrong_model", re.compile(r"^\d+ x Not Found$", re.M)),
                   ("could_not_connect", re.compile(r"ClientConnectorError|Cannot connect to host")))
_LOG_CAUSES = (("no_tokenizer", re.compile(r"in get_tokenizer$", re.M)),
               ("could_not_connect", re.compile(r"ClientConnectorError|Cannot connect to host")))
_CAUSE_WORDS = {"no_tokenizer": "no tokenizer", "unauthorized": "unauthorised", "wrong_model": "wrong model name",
                "could_not_connect": "could not connect", "unknown": "cause unknown"}


def request_errors(log: str) -> list[str]:
    """The failed requests' errors the bench printed ("Error <i>: <error>", at most ten), each
    as its last line (a traceback's names the exception), counted: ["8 x Unauthorized"]."""
    errors: list[list[str]] = []
    for line in log.splitlines():
        match = _ERROR_LINE.match(line)
        if match:
            errors.append([match.group(1)])
        elif errors and line.startswith("=" * 10):  # the result table follows the errors
            break
        elif errors:
            errors[-1].append(line)
    counts: dict[str, int] = {}
    for lines in errors:
        last = next((text.strip() for text in reversed(lines) if text.strip()), "(empty)")[:300]
        counts[last] = counts.get(last, 0) + 1
    return [f"{n} x {text}" for text, n in sorted(counts.items(), key=lambda kv: -kv[1])[:5]]


def _who(cfg: SoakConfig) -> str:
    return f"user {cfg.run_as}" if cfg.run_as else "the soak's user"


def log_tail(log: str, lines: int = 6) -> str:
    """The last lines of a log on one line, for a message."""
    return " | ".join(line.strip() for line in log.strip().splitlines()[-lines:]) or "(empty)"


def diagnose(log: str, *, rc: int | None, result: dict | None, result_problem: str | None, cfg: SoakConfig) -> dict:
    """Why one run of the bench completed no request, read from its output: ``{"cause",
    "message"}``, the cause one of no_tokenizer, unauthorized, wrong_model, could_not_connect
    or unknown (the message then quotes the log's last lines)."""
    errors = request_errors(log)
    if result is None:
        what = f"vllm bench serve exited {rc} and {result_problem}"
    elif rc:
        what = (f"vllm bench serve exited {rc} after {result.get('completed')} completed and "
                f"{result.get('failed')} failed")
    else:
        what = f"{result.get('failed')} request(s) failed"
    user = _who(cfg)
    advice = {
        "unauthorized": "the server refused the load generator's API key (401 Unauthorized): give the soak the key "
                        "the server was started with (api_key)",
        "wrong_model": f"the server does not serve the model name the load generator asked for "
                       f"({cfg.served_model_name or cfg.model or 'the first one listed'}; 404 Not Found): "
                       "served_model_name must be a name in the server's /v1/models",
        "could_not_connect": f"the load generator could not connect to {cfg.base_url}",
        "no_tokenizer": f"the load generator could not load its tokenizer "
                        f"({cfg.tokenizer or cfg.model or 'the server model'}) as {user}: give it a tokenizer "
                        "directory that user can read (tokenizer, else model)",
    }
    found = next((cause for cause, pattern in _REQUEST_CAUSES if pattern.search("\n".join(errors))), None)
    evidence = errors[0] if found else None
    if found is None:
        found = next((cause for cause, pattern in _LOG_CAUSES if pattern.search(log)), None)
        # The exception that ended the bench names the tokenizer's path (a repo id it is not, a file of
        # it that could not be read), whatever function raised it.
        path = tokenizer_path(cfg)
        if found is None and result is None and path and path in last_line(log, None):
            found = "no_tokenizer"
        evidence = last_line(log) if found else None
    if found is None:
        return {"cause": "unknown", "message": f"{_CAUSE_WORDS['unknown']}: {what}; last output: {log_tail(log)}"}
    return {"cause": found, "message": f"{_CAUSE_WORDS[found]}: {advice[found]} ({what}: {evidence})"}


# Run as the probe user, before any load: the directory it lists, each file at its top it opens
# (the bench's tokenizer reads tokenizer*.json and config.json from there), and one tokenizer* file.
_TOKENIZER_CHECK = """
import os, sys
path = sys.argv[1]
names = sorted(os.listdir(path))
for name in names:
    if os.path.isfile(os.path.join(path, name)):
        open(os.path.join(path, name), "rb").close()
if not any(name.startswith("tokenizer") for name in names):
    sys.exit("no tokenizer file (tokenizer.json, tokenizer_config.json, tokenizer.model) in " + path)
"""


def tokenizer_path(cfg: SoakConfig) -> str | None:
    """The local directory the bench loads its tokenizer from (``--tokenizer``, else ``--model``),
    None when it is a hub name or the server's model (not a path this node has)."""
    path = cfg.tokenizer or cfg.model
    return path if path and path.startswith("/") else None


def check_tokenizer(cfg: SoakConfig, run=subprocess.run) -> dict | None:
    """Before the load starts: whether the probe user can read the bench's tokenizer. None when
    it can (or there is no local path to check), else a load failure ``{"cause", "message"}``."""
    path = tokenizer_path(cfg)
    if path is None:
        return None
    user = _who(cfg)
    _, problem = run_probe(functools.partial(run, **as_user(cfg.run_as)),
                           [sys.executable, "-I", "-c", _TOKENIZER_CHECK, path], 60, f"reading {path} as {user}")
    if problem is None:
        return None
    return {"cause": "no_tokenizer",
            "message": f"{_CAUSE_WORDS['no_tokenizer']}: the load generator (vllm bench serve) loads its tokenizer "
                       f"from {path} and {user} cannot read it ({problem}): make it readable by {user}, or name a "
                       "readable tokenizer directory (tokenizer)"}


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


def run_length_s(run_s: float, duration_s: float) -> float:
    """How long one load run should last: ``run_s``, and at most a third of the soak."""
    return min(run_s, duration_s * RUN_SHARE_OF_SOAK)


def bench_summary(result: dict) -> dict:
    """The keys worth keeping of one run's result (no per-request arrays)."""
    summary = {k: result[k] for k in BENCH_SUMMARY_KEYS if k in result}
    summary.update({k: v for k, v in result.items() if re.match(r"(mean|median|std|p[0-9.]+)_[a-z]+_ms\Z", k)})
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
    """``vllm bench serve`` run after run until stopped; each run's summary kept, each run that
    completed no request diagnosed (``failures``)."""

    def __init__(self, cfg: SoakConfig, state_dir: str, popen=subprocess.Popen):
        self.cfg = cfg
        self.dir = os.path.join(state_dir, BENCH_DIR)  # root's: each run's summary and log
        self.scratch: str | None = None  # the probe user's: where the bench saves its result
        self._popen = popen
        self.proc = None
        self.index = 0
        self.results: list[dict] = []
        self.failures: list[dict] = []  # {"run", "exit_status", "cause", "message"}
        self.consecutive_errors = 0
        self.seed_base = int(time.time()) % 100000
        self._current: str | None = None

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        no_proxy = ",".join(filter(None, [env.get("no_proxy") or env.get("NO_PROXY"), "127.0.0.1,localhost,::1"]))
        env["no_proxy"] = env["NO_PROXY"] = no_proxy
        if self.cfg.run_as:  # root's HOME is not the probe user's: its caches go to the scratch directory
            env["HOME"] = self.scratch
        if self.cfg.api_key:
            env["OPENAI_API_KEY"] = self.cfg.api_key
        return env

    def start(self) -> None:
        identity = as_user(self.cfg.run_as)  # checked by SoakConfig.validate
        if self.scratch is None:
            os.makedirs(self.dir, mode=0o750, exist_ok=True)
            self.scratch = make_scratch(self.cfg.scratch_dir, os.path.basename(os.path.normpath(self.cfg.state_dir)),
                                        identity)
        self.index += 1
        name = self._current = f"run-{self.index:03d}"
        n = self.cfg.num_prompts or next_num_prompts(
            concurrency=self.cfg.concurrency, input_len=self.cfg.input_len, output_len=self.cfg.output_len,
            run_s=run_length_s(self.cfg.run_s, self.cfg.duration_s), last_result=self.results[-1] if self.results else None, baseline=self.cfg.baseline)
        cmd = bench_command(self.cfg, n, self.seed_base + self.index, self.scratch, f"{name}.raw.json")
        log = os.open(os.path.join(self.dir, f"{name}.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            self.proc = self._spawn(cmd, log, identity)
        except OSError as exc:
            self.proc = None
            self._fail(name, None, {"cause": "unknown", "message": f"unknown: cannot start {cmd[0]}: {exc}"})
        finally:
            os.close(log)  # the bench writes through its own copy

    def _spawn(self, cmd: list[str], log: int, identity: dict):
        """The one place the bench is started: as the probe user, output to root's log file."""
        return self._popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
                           cwd=self.scratch, close_fds=True, **identity)

    def poll(self) -> dict | None:
        """The summary of a run that just finished and completed requests, else None (a
        run that completed none is diagnosed into ``failures``)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        self.proc = None
        name = self._current
        raw = os.path.join(self.scratch, f"{name}.raw.json")
        result, problem = read_result(raw)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(raw)  # a link planted there goes, not what it points at
        log = self.log(name)
        if rc != 0 or result is None or not result.get("completed"):
            self._fail(name, rc, diagnose(log, rc=rc, result=result, result_problem=problem, cfg=self.cfg))
            return None
        summary = bench_summary(result)
        summary["run"] = name
        errors = request_errors(log)
        if errors:
            summary["errors"] = errors
        with open(os.path.join(self.dir, f"{name}.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
        self.results.append(summary)
        self.consecutive_errors = 0
        return summary

    def _fail(self, name: str, rc: int | None, diagnosis: dict) -> None:
        self.failures.append({"run": name, "exit_status": rc, **diagnosis})
        self.consecutive_errors += 1

    def log(self, name: str) -> str:
        """The end of a run's log (the bench wrote it: read as untrusted)."""
        try:
            return read_untrusted(os.path.join(self.dir, f"{name}.log"), LOG_TAIL_BYTES,
                                  tail=True).decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log: {exc})"

    @property
    def running(self) -> bool:
        return self.proc is not None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def close(self) -> None:
        """Stop the bench and remove its scratch directory (shutil.rmtree does not follow links)."""
        self.stop()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

