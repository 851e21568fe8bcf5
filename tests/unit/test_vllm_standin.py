"""The stand-in vLLM 0.25.1 (tests/fixtures/vllm_standin): the server, CLI, bench and fault
model that every rollout test runs as the real vLLM, held to the real one (its README names
the real source of each behaviour; the bench is compared with the real client's captures
in tests/fixtures/vllm_bench_real).

Servers run as subprocesses (an API server and its EngineCore child) on a free loopback
port, against the fake NVML and the stand-in torch + nvidia-cudnn-cu13 wheels, with the
simulated rates scaled up.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.nvml.build import PROFILES_DIR, build_fake_nvml
from tests.fixtures.wheels.build import build_wheel, build_wheelhouse, dist_info_dir

SRC = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_standin" / "src"
NVFP4_MODEL = "/models/qwen3.6-35b-a3b-nvfp4"
FP8_MODEL = "/models/qwen3.6-35b-a3b-fp8"
RTX_PRO_6000_MEMORY = 102641958912  # what NVML reports for the 96 GB card
RTX_PRO_6000_UUID = "GPU-7c3e9a52-1f0b-4d6e-9a1c-5b2f8e4d0a61"  # as in the fake NVML profile
CUDNN_WHEELS = {91900: "9.19.0.56", 92400: "9.24.0.43"}
# Fast simulated time: 250 tokens per 5 ms step, a node that "loads" in 0.2 s.
FAST = {
    "VLLM_STANDIN_LOAD_SECONDS": "0.2",
    "VLLM_STANDIN_TOKENS_PER_SECOND": "50000",
    "VLLM_STANDIN_STEP_SECONDS": "0.005",
    "VLLM_STANDIN_EXIT_DELAY_SECONDS": "1.5",
    "VLLM_STANDIN_SEED": "7",
}
METRIC_NAMES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum",
    "vllm:request_success_total",
)


# ---------------------------------------------------------------- GPU stand-ins


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """The fake NVML and one site dir per cuDNN: stand-in torch + that cuDNN wheel unpacked."""
    root = tmp_path_factory.mktemp("gpu")
    nvml = build_fake_nvml(root / "nvml").parent
    wheelhouse = build_wheelhouse(root / "wheelhouse")
    sites = {}
    for number, version in CUDNN_WHEELS.items():
        sites[number] = root / f"site-{number}"
        for wheel in ("torch-2.11.0-py3-none-manylinux_2_17_x86_64.whl",
                      f"nvidia_cudnn_cu13-{version}-py3-none-manylinux_2_17_x86_64.whl"):
            with zipfile.ZipFile(wheelhouse / wheel) as whl:
                whl.extractall(sites[number])
    return {"nvml": nvml, "sites": sites, "empty": root}


def _env(gpu, profile: str, cudnn: int, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VLLM_") and k not in ("CUDA_VISIBLE_DEVICES", "OPENAI_API_KEY")}
    env.update(FAST)
    env.update(PYTHONPATH=f"{SRC}{os.pathsep}{gpu['sites'][cudnn]}", LD_LIBRARY_PATH=str(gpu["nvml"]),
               FAKE_NVML_CONFIG=str(PROFILES_DIR / f"{profile}.conf"), PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


# ---------------------------------------------------------------- a served node


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http(method: str, url: str, payload=None, headers=None) -> tuple[int, bytes]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Node:
    """A `vllm serve` subprocess and what it wrote."""

    def __init__(self, proc: subprocess.Popen, port: int, logs: Path):
        self.proc, self.port, self.logs = proc, port, logs
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **kw) -> tuple[int, bytes]:
        return _http("GET", self.url + path, **kw)

    def post(self, path: str, payload: dict, **kw) -> tuple[int, dict]:
        status, body = _http("POST", self.url + path, payload, **kw)
        return status, json.loads(body)

    def stderr(self) -> str:
        return (self.logs / "stderr").read_text()

    def stdout(self) -> str:
        return (self.logs / "stdout").read_text()

    def output(self) -> str:
        """Both streams: vLLM logs on stdout (VLLM_LOGGING_STREAM), tracebacks and uvicorn on stderr."""
        return self.stdout() + self.stderr()

    def metrics(self) -> dict[str, float]:
        """Samples by `name{labels}`, plus each bare name when it has a single sample."""
        status, body = self.get("/metrics")
        assert status == 200
        samples, names = {}, {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                samples[key] = float(value)
                names.setdefault(key.split("{")[0], []).append(float(value))
        samples.update({name: values[0] for name, values in names.items() if len(values) == 1})
        return samples

    def wait_ready(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"vllm serve exited {self.proc.returncode}:\n{self.output()}"
            with contextlib.suppress(OSError):
                if self.get("/health")[0] == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"vllm serve not ready in {timeout} s:\n{self.output()}")


@contextlib.contextmanager
def serve(gpu, tmp_path: Path, *args: str, profile="rtx_pro_6000", cudnn=92400, model=NVFP4_MODEL,
          env=None, ready=True):
    port = _free_port()
    logs = tmp_path / f"serve-{port}"
    logs.mkdir()
    cmd = [sys.executable, "-m", "vllm.cli", "serve", *([model] if model else []), "--host", "127.0.0.1",
           "--port", str(port),
           "--max-model-len", "8192", "--kv-cache-dtype", "fp8", *args]
    with open(logs / "stdout", "w") as out, open(logs / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, env=_env(gpu, profile, cudnn, env), stdout=out, stderr=err)
    node = Node(proc, port, logs)
    try:
        if ready:
            node.wait_ready()
        yield node
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:  # a loaded CI machine can take its time to shut the server down
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _stream(node: Node, payload: dict, path="/v1/completions", on_event=None) -> list:
    """The SSE events of one streaming request: decoded JSON, or the string '[DONE]'."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=15)
    conn.request("POST", path, body=json.dumps({**payload, "stream": True}),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type").startswith("text/event-stream")
    events = []
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
            if on_event:
                on_event(events[-1])
    conn.close()
    return events


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A model directory holding only the small tokenizer `vllm bench serve` loads."""
    from tests.fixtures.vllm_standin.tokenizer import write_tokenizer

    directory = tmp_path_factory.mktemp("model") / "qwen3.6-35b-a3b-fp8"
    write_tokenizer(str(directory))
    return directory


def _run_bench(url: str, tmp_path: Path, *args: str, env=None, timeout=30) -> tuple[subprocess.CompletedProcess, Path]:
    out_dir = tmp_path / f"bench-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "vllm.cli", "bench", "serve", "--backend", "vllm", "--base-url", url,
           "--dataset-name", "random", "--ignore-eos", "--save-result", "--result-dir", str(out_dir),
           "--result-filename", "result.json", *args]
    run = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})}, capture_output=True,
                         text=True, timeout=timeout)
    return run, out_dir / "result.json"


def _bench(node: Node, tmp_path: Path, tokenizer: Path, *args: str, env=None, timeout=30) -> tuple[dict, str]:
    run, result = _run_bench(node.url, tmp_path, "--tokenizer", str(tokenizer), *args, env=env, timeout=timeout)
    assert run.returncode == 0, run.stderr
    return json.loads(result.read_text()), run.stdout


# ---------------------------------------------------------------- in-process pieces


@pytest.fixture
def standin(monkeypatch):
    """The stand-in package imported here, and forgotten again afterwards."""
    monkeypatch.syspath_prepend(str(SRC))
    import vllm.cli
    import vllm.device
    import vllm.engine
    import vllm.knobs
    import vllm.metrics

    yield vllm
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def _reference_load(standin, model: str, enforce_eager=False) -> dict:
    """32 clients x 81k in / 256 out on an RTX PRO 6000 with the stable profile, in simulated time."""
    engine_mod = standin.engine
    args = argparse.Namespace(model=model, enforce_eager=enforce_eager, kv_cache_dtype="fp8",
                              gpu_memory_utilization=0.95, max_model_len=262144, max_num_seqs=128,
                              max_num_batched_tokens=32768)
    config = engine_mod.engine_config(args, RTX_PRO_6000_MEMORY, standin.knobs.Knobs())
    engine = engine_mod.Engine(config, standin.metrics.Metrics(model))
    for _ in range(32):
        engine.add(engine_mod.Request(81000, 256, 256, arrival=0.0))
    now, steps, peak = 0.0, 0, 0.0
    while engine.has_work():
        now += config.step_seconds
        engine.step(now)
        steps += 1
        peak = max(peak, engine.kv_usage())
    tpot = engine.metrics.tpot
    return {"tokens_per_s": 32 * (81000 + 256) / now, "kv_peak": peak, "tpot": tpot.sum / tpot.count,
            "steps": steps, "batches": engine.batches, "step_seconds": config.step_seconds}


def test_reference_load_reproduces_the_story(standin):
    fp8 = _reference_load(standin, FP8_MODEL)
    nvfp4 = _reference_load(standin, NVFP4_MODEL)
    eager = _reference_load(standin, NVFP4_MODEL, enforce_eager=True)

    assert 12000 < fp8["tokens_per_s"] < 13200  # the 12.8k tokens/s baseline
    assert 1.08 < nvfp4["tokens_per_s"] / fp8["tokens_per_s"] < 1.14  # ~ +11%
    assert nvfp4["tpot"] < fp8["tpot"]
    assert 0.52 < fp8["kv_peak"] < 0.58  # KV peaks at 55%...
    assert 0.10 < fp8["kv_peak"] - nvfp4["kv_peak"] < 0.14  # ...and ~12 points lower on NVFP4
    assert eager["tokens_per_s"] < fp8["tokens_per_s"]  # eager gives the win back and more
    # Every step runs a batch under this load, so the default mean crash step is ~23 min in.
    assert nvfp4["batches"] == nvfp4["steps"]
    minutes = standin.knobs.DEFAULT_MEAN_STEPS_TO_CRASH * nvfp4["step_seconds"] / 60
    assert 22.5 < minutes < 23.5


def test_scheduler_bounds_the_batch_and_preempts_when_kv_is_full(standin):
    engine_mod, metrics = standin.engine, standin.metrics.Metrics("m")
    config = engine_mod.EngineConfig(step_seconds=0.01, tokens_per_step=1000, max_num_seqs=2,
                                     max_num_batched_tokens=8192, kv_capacity_tokens=90)
    engine = engine_mod.Engine(config, metrics)
    requests = [engine_mod.Request(30, 20, 20, arrival=0.0) for _ in range(5)]
    for request in requests:
        engine.add(request)
    engine.step(0.01)
    assert (len(engine.running), len(engine.waiting)) == (2, 3)  # max-num-seqs holds the rest back
    now = 0.01
    while engine.has_work():
        now += 0.01
        engine.step(now)
        assert engine.kv_usage() <= 1.0
    assert all(r.generated == 20 for r in requests)
    assert metrics.finished["length"] == 5
    assert metrics.preemptions > 0  # two requests growing to 50 tokens outgrow 90


def test_kv_token_scale_lets_a_small_load_show_reference_levels(standin):
    engine_mod = standin.engine
    config = engine_mod.EngineConfig(step_seconds=0.01, tokens_per_step=1000, max_num_seqs=8,
                                     max_num_batched_tokens=8192, kv_capacity_tokens=1000, kv_token_scale=10)
    engine = engine_mod.Engine(config, standin.metrics.Metrics("m"))
    assert config.max_request_tokens == 100
    engine.add(engine_mod.Request(40, 5, 5, arrival=0.0))
    engine.step(0.01)
    assert engine.kv_usage() == pytest.approx(0.4)  # 40 tokens held, each counting as 10


@pytest.mark.parametrize("on_arrival", [False, True])
def test_prompt_tokens_counted_on_arrival_move_without_a_step(standin, on_arrival):
    """The knob behind the retrying-clients wedge test: with it, arrivals alone move
    vllm:prompt_tokens_total (and nothing else); without it (negative control) they do not."""
    engine_mod, metrics = standin.engine, standin.metrics.Metrics("m")
    config = engine_mod.EngineConfig(step_seconds=0.01, tokens_per_step=1000, max_num_seqs=8,
                                     max_num_batched_tokens=8192, kv_capacity_tokens=10_000,
                                     prompt_tokens_on_arrival=on_arrival)
    engine = engine_mod.Engine(config, metrics)
    for _ in range(3):  # no step runs: a wedged engine
        engine.add(engine_mod.Request(40, 5, 5, arrival=0.0))
    assert (metrics.prompt_tokens, metrics.generation_tokens) == ((120 if on_arrival else 0), 0)
    while engine.has_work():
        engine.step(0.01)
    assert metrics.prompt_tokens == 120  # counted once either way
    assert standin.knobs.Knobs.from_env({"VLLM_STANDIN_PROMPT_TOKENS_ON_ARRIVAL": "1"}).prompt_tokens_on_arrival == 1


def test_fault_counts_batches_only(standin):
    engine_mod = standin.engine
    config = engine_mod.EngineConfig(step_seconds=0.01, tokens_per_step=100, max_num_seqs=8,
                                     max_num_batched_tokens=8192, kv_capacity_tokens=10_000)
    engine = engine_mod.Engine(config, standin.metrics.Metrics("m"), crash_at_batch=3, cuda_error="misaligned address")
    for t in range(10):  # idle steps run no batch
        engine.step(t)
    engine.add(engine_mod.Request(10, 50, 50, arrival=10.0))
    engine.step(11)
    engine.step(12)
    with pytest.raises(engine_mod.CudaFault, match="misaligned address"):
        engine.step(13)


@pytest.mark.parametrize("capability, cudnn, graphs, tp, expected", [
    ((12, 0), 91900, True, 1, "stochastic"),
    ((12, 1), 92300, True, 1, "stochastic"),
    ((12, 0), 92301, True, 1, None),  # fixed in 9.23.1
    ((12, 0), 91900, False, 1, None),  # eager hides it
    ((12, 0), 91900, True, 2, None),  # TP=1 only
    ((10, 0), 91900, True, 1, None),  # datacenter Blackwell is fine
])
def test_fault_rule(standin, capability, cudnn, graphs, tp, expected):
    assert standin.device.fault_rule(capability, cudnn, cuda_graphs=graphs, tensor_parallel_size=tp) == expected


def test_config_file_as_the_real_parser_reads_it(standin, tmp_path):
    """vllm/utils/argparse_utils.py: `--config FILE` only, config args right after `serve
    [MODEL]` (the command line wins), true -> flag, false -> dropped, list -> values."""
    config = tmp_path / "serve.yaml"
    config.write_text(
        "model: /models/from-file-nvfp4\n"
        "max-num-seqs: 64\n"
        "enable-prefix-caching: false\n"  # silently dropped: the engine's default stays
        "enable-chunked-prefill: true\n"
        "enforce-eager: true\n"
        "kv-cache-dtype: fp8\n"
        "served-model-name: [qwen, qwen-alias]\n"
        "gpu_memory_utilization: 0.95\n")
    args = standin.cli.parse_args(["serve", "--config", str(config), "--max-num-seqs", "8", "--max_model_len", "128k"])
    assert args.model == "/models/from-file-nvfp4"
    assert args.max_num_seqs == 8  # the command line wins
    assert args.enable_prefix_caching is None and args.enable_chunked_prefill is True
    assert args.enforce_eager is True
    assert args.served_model_name == ["qwen", "qwen-alias"]
    assert args.gpu_memory_utilization == 0.95
    assert args.max_model_len == 128000
    assert "enforce_eager" in args.non_default and "port" not in args.non_default and "config" not in args.non_default

    config.write_text("no-enable-prefix-caching: true\nenforce-eager: false\n")
    args = standin.cli.parse_args(["serve", "/models/positional", "--config", str(config)])
    assert (args.enable_prefix_caching, args.enforce_eager, args.model) == (False, False, "/models/positional")

    # `--config=FILE` is not the config form: argparse stores the name and nothing is read,
    # so the default model would be served (the real parser does the same).
    config.write_text("model: /models/from-file-nvfp4\nmax-num-seqs: 64\n")
    args = standin.cli.parse_args(["serve", f"--config={config}"])
    assert (args.model, args.max_num_seqs) == ("Qwen/Qwen3-0.6B", None)
    assert args.non_default == {"config": str(config)}

    config.write_text("no-such-flag: 1\n")
    with pytest.raises(SystemExit) as exited:
        standin.cli.parse_args(["serve", "m", "--config", str(config)])
    assert exited.value.code == 2
    config.write_text("api-key: [-starts-with-a-dash]\n")  # each item is an argv word
    with pytest.raises(SystemExit) as exited:
        standin.cli.parse_args(["serve", "m", "--config", str(config)])
    assert exited.value.code == 2
    json_config = tmp_path / "serve.json"
    json_config.write_text("{}")
    with pytest.raises(ValueError, match="Config file must be of a yaml/yml type. json supplied"):
        standin.cli.parse_args(["serve", "m", "--config", str(json_config)])


@pytest.mark.parametrize("argv, error", [
    (["--max-model-len", "1.5K"], "Decimals are not allowed with binary suffixes like K"),
    (["--disable-log-requests"], "unrecognized arguments: --disable-log-requests"),
    (["--swap-space", "4"], "unrecognized arguments: --swap-space"),
    (["--moe-backend", "fastest"], "argument --moe-backend: invalid choice: 'fastest'"),
    (["--no-disable-log-stats"], "unrecognized arguments: --no-disable-log-stats"),
])
def test_flags_real_0_25_1_refuses(standin, capsys, argv, error):
    with pytest.raises(SystemExit) as exited:
        standin.cli.parse_args(["serve", "m", *argv])
    assert exited.value.code == 2 and error in capsys.readouterr().err


def test_flags_as_the_real_parser_types_them(standin):
    args = standin.cli.parse_args(["serve", "m", "--max-model-len", "1.5k", "--max-num-batched-tokens", "32K",
                                   "--moe-backend", "FLASHINFER-CUTLASS", "--no-enable-log-requests", "-tp", "1",
                                   "--api-key", "a", "b", "--shutdown-timeout", "30", "--load-format", "hf"])
    assert (args.max_model_len, args.max_num_batched_tokens, args.moe_backend) == (1500, 32768, "flashinfer_cutlass")
    assert (args.api_key, args.shutdown_timeout, args.enable_log_requests) == (["a", "b"], 30, False)
    assert standin.cli.parse_args(["serve", "m"]).shutdown_timeout == 0


def test_version_and_unknown_flag():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    version = subprocess.run([sys.executable, "-m", "vllm.cli", "--version"], env=env, capture_output=True, text=True)
    assert (version.returncode, version.stdout.strip()) == (0, "0.25.1")
    unknown = subprocess.run([sys.executable, "-m", "vllm.cli", "serve", "m", "--enable-magic"], env=env,
                             capture_output=True, text=True)
    assert unknown.returncode == 2
    assert "unrecognized arguments: --enable-magic" in unknown.stderr


# ---------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def healthy(gpu, tmp_path_factory):
    """A fixed node (sm_120, cuDNN 9.24) configured from a file, as the role renders it."""
    tmp = tmp_path_factory.mktemp("healthy")
    config = tmp / "serve.yaml"
    config.write_text(f"model: {NVFP4_MODEL}\nserved-model-name: qwen-test\nmax-num-seqs: 16\n"
                      "enable-prefix-caching: true\nenforce-eager: false\n")
    env = {"CUDA_VISIBLE_DEVICES": RTX_PRO_6000_UUID}
    with serve(gpu, tmp, "--config", str(config), model=None, env=env) as node:
        yield node


def test_endpoints_and_metrics(healthy):
    status, body = healthy.get("/health")
    assert (status, body) == (200, b"")
    assert json.loads(healthy.get("/version")[1]) == {"version": "0.25.1"}
    models = json.loads(healthy.get("/v1/models")[1])["data"]
    assert [(m["id"], m["root"], m["max_model_len"]) for m in models] == [("qwen-test", NVFP4_MODEL, 8192)]

    before = healthy.metrics()
    status, reply = healthy.post("/v1/completions", {"model": "qwen-test", "prompt": "one two three four five six 7",
                                                     "max_tokens": 5, "ignore_eos": True})
    assert status == 200
    assert reply["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    assert reply["choices"][0]["finish_reason"] == "length"
    assert len(reply["choices"][0]["text"].split()) == 5

    after = healthy.metrics()
    labels = 'model_name="qwen-test",engine="0"'
    for name in METRIC_NAMES:
        assert any(key.startswith(f"{name}{{{labels}") for key in after), name
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 5
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 7
    success = f'vllm:request_success_total{{{labels},finished_reason="length"}}'
    assert after[success] - before[success] == 1
    assert after[f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}}'] >= 1
    assert 0.0 <= after["vllm:kv_cache_usage_perc"] <= 1.0
    assert "gpu_cache_usage_perc" not in healthy.get("/metrics")[1].decode()

    assert healthy.post("/v1/completions", {"model": "other", "prompt": "hi"})[0] == 404
    status, reply = healthy.post("/v1/completions", {"prompt": "hi", "max_tokens": 9000})
    assert status == 400 and "maximum context length is 8192" in reply["error"]["message"]
    assert healthy.get("/nope")[0] == 404

    detected = healthy.output()
    assert "(NVML index 0): compute capability 12.0, cuDNN 92400 as loaded by torch, CUDA graphs on" in detected


def test_streaming_completions_and_chat(healthy):
    events = _stream(healthy, {"prompt": "a b c", "max_tokens": 6, "ignore_eos": True,
                               "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    tokens = [e for e in events[:-1] if e["choices"]]
    assert [bool(t["choices"][0]["text"]) for t in tokens] == [True] * 6
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None] * 5 + ["length"]
    assert events[-2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}

    chat = _stream(healthy, {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4,
                             "ignore_eos": True}, path="/v1/chat/completions")
    assert chat[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [e["choices"][0]["delta"]["content"] for e in chat[1:-1]]
    assert len(contents) == 4 and all(contents)
    assert chat[-2]["choices"][0]["finish_reason"] == "length" and chat[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" for e in chat[:-1])


REAL_BENCH = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_bench_real"


def _real_keys(case: str) -> list[str]:
    """The keys, in order, of a result file the real 0.25.1 client wrote (captured)."""
    return list(json.loads((REAL_BENCH / case / "result.json").read_text()))


def test_bench_writes_the_real_keys(healthy, tmp_path, tokenizer_dir):
    # The real client's argv for its captures (tests/fixtures/vllm_bench_real/*/run.json).
    load = ("--model", str(tokenizer_dir), "--served-model-name", "qwen-test", "--num-prompts", "8",
            "--max-concurrency", "4", "--random-input-len", "32", "--random-output-len", "16", "--seed", "1",
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--disable-tqdm")
    result, stdout = _bench(healthy, tmp_path, tokenizer_dir, *load)
    assert list(result) == _real_keys("a_success")  # rtfx, no errors, no per-request arrays
    for key in ("errors", "ttfts", "itls", "input_lens", "output_lens", "generated_texts", "start_times"):
        assert key not in result
    assert (result["completed"], result["failed"], result["num_prompts"], result["rtfx"]) == (8, 0, 8, 0.0)
    assert (result["model_id"], result["tokenizer_id"], result["request_rate"]) == (
        str(tokenizer_dir), str(tokenizer_dir), "inf")
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (256, 128)
    assert result["output_throughput"] == pytest.approx(128 / result["duration"])
    assert all(result[f"{stat}_{metric}_ms"] > 0 for stat in ("mean", "p50", "p99") for metric in ("ttft", "itl"))
    for line in ("Starting initial single prompt test run...", "Skipping endpoint ready check.",
                 "Starting main benchmark run...", "Serving Benchmark Result", "P99 ITL (ms):"):
        assert line in stdout
    # The prompts are the tokenizer's words.
    detailed, _ = _bench(healthy, tmp_path, tokenizer_dir, *load, "--save-detailed")
    assert list(detailed) == _real_keys("b_save_detailed")
    assert detailed["input_lens"] == [32] * 8 and detailed["output_lens"] == [16] * 8
    assert detailed["errors"] == [""] * 8 and [len(itl) for itl in detailed["itls"]] == [15] * 8


@pytest.mark.parametrize("case", ["missing", "unreadable"])
def test_bench_without_a_tokenizer_it_can_read_fails_like_the_real_one(healthy, tmp_path, request, case):
    """The real client exits 1 with a traceback ending in the loader's exception
    (tests/fixtures/vllm_bench_real/e_*), and sends nothing."""
    if case == "missing":
        model = tmp_path / "missing" / "qwen3.6-35b-a3b-fp8"
        captured = "e_no_tokenizer"
    else:
        if os.geteuid() == 0 and not shutil.which("setpriv"):
            pytest.skip("root reads everything and setpriv is missing")
        from tests.fixtures.vllm_standin.tokenizer import write_tokenizer

        site = Path(tempfile.mkdtemp(prefix="models-"))  # a path every user may walk, as /models is
        site.chmod(0o755)
        request.addfinalizer(lambda: shutil.rmtree(site))
        model = site / "private" / "qwen3.6-35b-a3b-fp8"
        write_tokenizer(str(model), mode=0o600)  # the owner's alone: root runs the bench as nobody
        (site / "private").chmod(0o755)
        if os.geteuid() != 0:  # not root: the directory is closed to its owner too
            model.chmod(0)
            request.addfinalizer(lambda: model.chmod(0o700))
        captured = "e_unreadable_tokenizer"
    before = healthy.metrics()["vllm:prompt_tokens_total"]
    cmd = [sys.executable, "-m", "vllm.cli", "bench", "serve", "--base-url", healthy.url, "--model", str(model),
           "--served-model-name", "qwen-test", "--num-prompts", "2", "--random-input-len", "4",
           "--random-output-len", "2"]
    if case == "unreadable" and os.geteuid() == 0:  # as the probe user would: not root, not the owner
        cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd]
    run = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=30)
    real_last_line = (REAL_BENCH / captured / "output.log").read_text().strip().splitlines()[-1]
    real_last_line = real_last_line.replace(f"/tmp/vllm-bench-capture/{case if case == 'missing' else 'private'}"
                                            "/qwen3.6-35b-a3b-fp8", str(model))
    assert run.returncode == json.loads((REAL_BENCH / captured / "run.json").read_text())["exit_status"] == 1
    assert "Traceback (most recent call last):" in run.stderr
    assert run.stderr.strip().splitlines()[-1] == real_last_line
    assert healthy.metrics()["vllm:prompt_tokens_total"] == before  # no load reached the server


def test_bench_with_a_wrong_key_exits_0_with_nothing_completed(gpu, tmp_path, tokenizer_dir):
    with serve(gpu, tmp_path, "--api-key", "sk-right") as node:
        result, stdout = _bench(node, tmp_path, tokenizer_dir, "--model", str(tokenizer_dir), "--served-model-name",
                                NVFP4_MODEL, "--num-prompts", "8", "--max-concurrency", "4",
                                "--random-input-len", "8", "--random-output-len", "4", "--metric-percentiles", "50,99",
                                env={"OPENAI_API_KEY": "sk-wrong-key"})
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (0, 8, 0)
    assert list(result) == _real_keys("c_wrong_api_key")
    real = (REAL_BENCH / "c_wrong_api_key" / "output.log").read_text()
    errors = [line for line in stdout.splitlines() if line.startswith(("Error ", "Failed requests"))]
    assert errors == [line for line in real.splitlines() if line.startswith(("Error ", "Failed requests"))]
    assert errors[1] == "Error 0: Unauthorized"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_api_key_is_enforced_and_logged_only_as_an_argument(gpu, tmp_path, how):
    """0.25.1 logs every non-default argument, the key included (api_utils.py); a key given
    only as VLLM_API_KEY is no argument and is not logged."""
    key = "sk-standin-7f3a9c"
    args, env = (("--api-key", key), None) if how == "flag" else ((), {"VLLM_API_KEY": key})
    with serve(gpu, tmp_path, *args, env=env) as node:
        assert node.get("/v1/models")[0] == 401
        assert node.get("/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert node.post("/v1/completions", {"prompt": "hi", "max_tokens": 1})[0] == 401
        assert node.get("/v1/models", headers={"Authorization": f"Bearer {key}"})[0] == 200
        status, reply = node.post("/v1/completions", {"prompt": "hi", "max_tokens": 2},
                                  headers={"Authorization": f"Bearer {key}"})
        assert status == 200 and reply["usage"]["completion_tokens"] <= 2
        assert node.get("/health")[0] == 200 and node.get("/metrics")[0] == 200
        node.proc.terminate()
        assert node.proc.wait(timeout=10) == 0
        assert "Application startup complete." in node.output()
        logged = [line for line in node.stdout().splitlines() if key in line]
        if how == "flag":
            [line] = logged
            assert "INFO" in line and "[api_utils.py:" in line and f"non-default args: {{'model_tag': " in line
            assert f"'api_key': ['{key}']" in line
        else:
            assert logged == [] and key not in node.stderr()


def test_several_keys_given_as_the_flag_are_each_accepted_and_override_the_environment(gpu, tmp_path):
    """A rotation's window: --api-key NEW OLD (vLLM's list), VLLM_API_KEY ignored beside it."""
    new, old, env_key = "sk-standin-new-1", "sk-standin-old-2", "sk-standin-env-3"
    with serve(gpu, tmp_path, "--api-key", new, old, env={"VLLM_API_KEY": env_key}) as node:
        for key, status in ((new, 200), (old, 200), (env_key, 401), ("wrong", 401)):
            assert node.get("/v1/models", headers={"Authorization": f"Bearer {key}"})[0] == status, key


def test_crash_on_sm120_with_old_cudnn(gpu, tmp_path):
    with serve(gpu, tmp_path, cudnn=91900, env={"VLLM_STANDIN_MEAN_STEPS_TO_CRASH": "5"}) as node:
        assert "cuDNN 91900 as loaded by torch, CUDA graphs on" in node.output()
        events = _stream(node, {"prompt": "a b c", "max_tokens": 4000, "ignore_eos": True})
        assert events[-1] == "[DONE]"
        assert "EngineCore encountered an issue" in events[-2]["error"]["message"]
        assert node.get("/health")[0] == 503  # dead, not yet gone
        assert node.post("/v1/completions", {"prompt": "hi"})[0] == 500
        assert node.proc.wait(timeout=10) == 0  # and then exits 0 (upstream issue 48966)
        stderr = node.output()
    assert ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered" in stderr
            or "torch.AcceleratorError: CUDA error: misaligned address" in stderr)
    assert ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.") in stderr


@pytest.mark.parametrize("profile, cudnn, args", [
    ("rtx_pro_6000", 92400, ()),  # the fix
    ("b200", 91900, ()),  # sm_100 never had the bug
    ("rtx_pro_6000", 91900, ("--enforce-eager",)),  # hidden, not fixed
])
def test_no_crash_where_the_bug_does_not_apply(gpu, tmp_path, profile, cudnn, args):
    with serve(gpu, tmp_path, *args, profile=profile, cudnn=cudnn,
               env={"VLLM_STANDIN_MEAN_STEPS_TO_CRASH": "2"}) as node:
        status, reply = node.post("/v1/completions", {"prompt": "a b c", "max_tokens": 150, "ignore_eos": True})
        assert status == 200 and reply["usage"]["completion_tokens"] == 150
        assert node.get("/health")[0] == 200 and node.proc.poll() is None
        assert "EngineDeadError" not in node.output()


@pytest.mark.parametrize("profile", ["rtx_pro_6000", "h100"])
def test_nvfp4_kv_cache_fails_at_start_up_off_sm100(gpu, tmp_path, profile):
    """v1/attention/backends/flashinfer.py: the EngineCore raises while it builds the KV cache;
    the API server reports the failed core and exits 1 (v1/engine/utils.py)."""
    with serve(gpu, tmp_path, "--kv-cache-dtype", "nvfp4", profile=profile, ready=False) as node:
        assert node.proc.wait(timeout=15) == 1
        output = node.output()
    assert "EngineCore failed to start." in output
    assert "ValueError: --kv-cache-dtype nvfp4 requires the SM100 trtllm-gen FlashInfer path." in output
    assert ("RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {'EngineCore': 1}") in node.stderr()
    assert "Application startup complete." not in output


def test_nvfp4_kv_cache_serves_on_sm100(gpu, tmp_path):  # the control: B200 has the path
    with serve(gpu, tmp_path, "--kv-cache-dtype", "nvfp4", profile="b200") as node:
        assert node.post("/v1/completions", {"prompt": "a b c", "max_tokens": 3})[0] == 200


@pytest.mark.parametrize("profile, visible, errors", [
    (None, None, ["NVML Shared Library Not Found", "RuntimeError: Failed to infer device type"]),
    ("no_driver", None, ["Driver Not Loaded", "RuntimeError: Failed to infer device type"]),
    ("rtx_pro_6000", "1", ["RuntimeError: No CUDA GPUs are available"]),  # a one-GPU node
])
def test_no_usable_gpu_fails_at_start(gpu, tmp_path, profile, visible, errors):
    env = {"CUDA_VISIBLE_DEVICES": visible} if visible else {}
    if profile is None:
        if ctypes.util.find_library("nvidia-ml"):
            pytest.skip("this machine has a real libnvidia-ml")
        env["LD_LIBRARY_PATH"] = str(gpu["empty"])
    with serve(gpu, tmp_path, profile=profile or "rtx_pro_6000", env=env, ready=False) as node:
        assert node.proc.wait(timeout=10) == 1
        stderr = node.output()
    for error in errors:
        assert error in stderr


def test_enforce_eager_is_slower(gpu, tmp_path, tokenizer_dir):
    load = ("--num-prompts", "8", "--max-concurrency", "4", "--random-input-len", "32", "--random-output-len", "40")
    env = {"VLLM_STANDIN_STEP_SECONDS": "0.01"}  # long enough steps that HTTP time is noise
    with serve(gpu, tmp_path, env=env) as graphs, serve(gpu, tmp_path, "--enforce-eager", env=env) as eager:
        assert "CUDA graphs off" in eager.output()
        with_graphs, _ = _bench(graphs, tmp_path, tokenizer_dir, *load)
        without, _ = _bench(eager, tmp_path, tokenizer_dir, *load)
    assert with_graphs["completed"] == without["completed"] == 8
    assert without["output_throughput"] < 0.85 * with_graphs["output_throughput"]
    assert without["mean_tpot_ms"] > with_graphs["mean_tpot_ms"]


def test_wedge_keeps_health_green_with_zero_progress_and_the_bench_waits(gpu, tmp_path, tokenizer_dir):
    """SIGUSR1 to the API server's pid wedges the engine (in its child process); the bench
    waits on it as the real client does (up to 6 h per request), and finishes once it resumes."""
    with serve(gpu, tmp_path) as node:
        bench_result = {}
        bench = threading.Thread(target=lambda: bench_result.update(result=_bench(
            node, tmp_path, tokenizer_dir, "--num-prompts", "12", "--max-concurrency", "4",
            "--random-input-len", "10", "--random-output-len", "400", "--save-detailed")[0]))
        bench.start()
        deadline = time.monotonic() + 10
        while node.metrics()["vllm:generation_tokens_total"] < 500:  # past the bench's first request
            assert time.monotonic() < deadline
            time.sleep(0.05)

        node.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.1)  # a step already under way may finish
        frozen = node.metrics()["vllm:generation_tokens_total"]
        time.sleep(1.5)
        wedged = node.metrics()
        assert wedged["vllm:generation_tokens_total"] == frozen
        assert wedged["vllm:num_requests_running"] > 0
        assert node.get("/health")[0] == 200
        assert bench.is_alive()  # still waiting: no give-up of its own

        node.proc.send_signal(signal.SIGUSR1)  # unwedge
        bench.join(timeout=20)
        assert not bench.is_alive()
        result = bench_result["result"]
        assert (result["completed"], result["failed"]) == (12, 0) and result["errors"] == [""] * 12
        assert node.metrics()["vllm:generation_tokens_total"] > frozen


def test_a_wedge_sent_to_every_process_of_the_unit_wedges_once(gpu, tmp_path):
    """`systemctl kill -s SIGUSR1` signals the API server and its EngineCore alike."""
    with serve(gpu, tmp_path) as node:
        for pid in (node.proc.pid, _engine_core_pid(node)):
            os.kill(pid, signal.SIGUSR1)
        time.sleep(0.2)
        streaming = threading.Thread(target=_stream, args=(node, {"prompt": "a", "max_tokens": 5, "ignore_eos": True}),
                                     daemon=True)
        streaming.start()
        time.sleep(0.5)
        assert node.metrics()["vllm:generation_tokens_total"] == 0 and streaming.is_alive()
        os.kill(node.proc.pid, signal.SIGUSR1)
        streaming.join(timeout=5)
        assert not streaming.is_alive() and node.metrics()["vllm:generation_tokens_total"] == 5


def _engine_core_pid(node: Node) -> int:
    [pid] = [int(line.split(" pid=")[1].split(")")[0]) for line in node.stdout().splitlines()
             if line.startswith("(EngineCore pid=")][:1]
    return pid


@pytest.mark.parametrize("how", ["SIGKILL", "SIGABRT"])
def test_the_engine_dies_alone_and_the_api_server_exits_0(gpu, tmp_path, how):
    """v1/engine/core_client.py: the monitor marks the engine dead when its process goes;
    the watchdog (entrypoints/launcher.py, the knob's 1.5 s here) then stops the server: exit 0."""
    with serve(gpu, tmp_path) as node:
        engine = _engine_core_pid(node)
        assert engine != node.proc.pid
        os.kill(engine, getattr(signal, how))
        deadline = time.monotonic() + 5
        while node.get("/health")[0] != 503:
            assert time.monotonic() < deadline and node.proc.poll() is None
            time.sleep(0.05)
        assert node.post("/v1/completions", {"prompt": "hi"})[0] == 500
        assert node.proc.wait(timeout=10) == 0
    assert "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup" in node.output()


def test_disable_log_stats_removes_every_vllm_series(gpu, tmp_path):
    """v1/engine/async_llm.py: no stat loggers, no vllm:* series; /metrics still answers."""
    with serve(gpu, tmp_path, "--disable-log-stats") as node, serve(gpu, tmp_path) as control:
        assert node.post("/v1/completions", {"prompt": "a b", "max_tokens": 2})[0] == 200
        status, body = node.get("/metrics")
        assert status == 200 and "process_start_time_seconds" in body.decode()
        assert not [line for line in body.decode().splitlines() if "vllm:" in line]
        assert "vllm:generation_tokens_total" in control.get("/metrics")[1].decode()


SILENCE_ARGS = {  # a logging configuration written for the real vLLM: its formatter class, one logger muted
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"vllm": {"class": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                            "format": "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"}},
    "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "INFO",
                          "stream": "ext://sys.stdout"}},
    "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
                "vllm.entrypoints.serve.utils.api_utils": {"level": "WARNING"}},
}


@pytest.mark.parametrize("silenced", [False, True])
def test_non_default_args_are_logged_with_the_key_unless_the_logging_config_mutes_them(gpu, tmp_path, silenced):
    key = "sk-in-the-journal-42"
    env = {}
    if silenced:
        (tmp_path / "logging.json").write_text(json.dumps(SILENCE_ARGS))
        env["VLLM_LOGGING_CONFIG_PATH"] = str(tmp_path / "logging.json")
    with serve(gpu, tmp_path, "--api-key", key, env=env) as node:
        node.proc.terminate()
        assert node.proc.wait(timeout=10) == 0
    output = node.output()
    assert "Starting vLLM API server 0 on" in output  # the rest still logs
    assert (key in output) is (not silenced)
    assert ("non-default args:" in output) is (not silenced)


def test_logging_config_path_needs_configure_logging(gpu, tmp_path):
    (tmp_path / "logging.json").write_text(json.dumps(SILENCE_ARGS))
    env = {"VLLM_LOGGING_CONFIG_PATH": str(tmp_path / "logging.json"), "VLLM_CONFIGURE_LOGGING": "0"}
    with serve(gpu, tmp_path, env=env, ready=False) as node:
        assert node.proc.wait(timeout=10) == 1
    assert "RuntimeError: VLLM_CONFIGURE_LOGGING evaluated to false, but VLLM_LOGGING_CONFIG_PATH" in node.stderr()


def test_unknown_vllm_environment_names_are_warned(gpu, tmp_path):
    """vllm/envs.py validate_environ: a name 0.25.1 does not read is warned at start; its own
    names and the stand-in's knobs (VLLM_STANDIN_*) are not."""
    env = {"VLLM_FLEET_HEALTH_URL": "http://x", "VLLM_ATTENTION_BACKEND": "FLASHINFER", "VLLM_USE_DEEP_GEMM_E8M0": "0"}
    with serve(gpu, tmp_path, env=env) as node:
        output = node.output()
    warned = {line.rsplit(": ", 1)[1] for line in output.splitlines()
              if "Unknown vLLM environment variable detected:" in line}
    assert warned == {"VLLM_FLEET_HEALTH_URL", "VLLM_ATTENTION_BACKEND"}
    assert all(" WARNING " in line for line in output.splitlines() if "Unknown vLLM environment" in line)


@pytest.mark.parametrize("timeout", [0, 10])
def test_shutdown_timeout_drains_or_aborts_a_long_request(gpu, tmp_path, timeout):
    """SIGTERM: --shutdown-timeout 0 aborts the request in flight; N lets it finish (within N s)
    and refuses new work (v1/engine/core.py _handle_shutdown, entrypoints/launcher.py)."""
    events = []
    with serve(gpu, tmp_path, "--shutdown-timeout", str(timeout), env={"VLLM_STANDIN_STEP_SECONDS": "0.01"}) as node:
        streaming = threading.Thread(target=lambda: events.extend(_stream(
            node, {"prompt": "a b c", "max_tokens": 300, "ignore_eos": True})))
        streaming.start()
        deadline = time.monotonic() + 5
        while node.metrics()["vllm:generation_tokens_total"] < 20:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        node.proc.terminate()
        streaming.join(timeout=15)
        assert node.proc.wait(timeout=15) == 0
    reasons = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    assert events[-1] == "[DONE]"
    if timeout:
        assert reasons[-1] == "length" and len(reasons) == 300
        assert "[shutdown] EngineCore: draining in-flight requests count=1 timeout=10s" in node.output()
    else:
        assert reasons[-1] == "abort" and len(reasons) < 300
        assert "[shutdown] API server: stopping engine client mode=abort timeout=0s" in node.output()


def test_a_server_that_goes_bad_with_time_answers_500_but_stays_healthy(gpu, tmp_path):
    """The knob behind the bake's fault: completions succeed, then 500 once
    VLLM_STANDIN_FAIL_AFTER_SECONDS have passed, while /health and /metrics stay green."""
    payload = {"model": NVFP4_MODEL, "prompt": "hello", "max_tokens": 2}
    with serve(gpu, tmp_path, env={"VLLM_STANDIN_LOAD_SECONDS": "0", "VLLM_STANDIN_FAIL_AFTER_SECONDS": "1.5"}) as node:
        assert node.post("/v1/completions", payload)[0] == 200
        time.sleep(1.6)
        status, body = node.post("/v1/completions", payload)
        assert status == 500 and body["error"]["type"] == "InternalServerError"
        assert node.get("/health")[0] == 200
        assert node.get("/metrics")[0] == 200


def test_wheel_installs_the_vllm_console_script(tmp_path):
    files = {str(p.relative_to(SRC)): p.read_bytes() for p in SRC.rglob("*.py")}
    files[f"{dist_info_dir('vllm', '0.25.1')}/entry_points.txt"] = "[console_scripts]\nvllm = vllm.cli:main\n"
    wheel = build_wheel("vllm", "0.25.1", files, ["torch==2.11.0", "nvidia-ml-py", "pyyaml"], tmp_path / "wheels")
    target = tmp_path / "target"
    subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "install", "--no-config", "--no-deps",
                    "--python", sys.executable, "--target", str(target), str(wheel)], check=True, capture_output=True)
    metadata = (target / "vllm-0.25.1.dist-info" / "METADATA").read_text()
    assert "Requires-Dist: torch==2.11.0" in metadata
    version = subprocess.run([str(target / "bin" / "vllm"), "--version"], env={**os.environ, "PYTHONPATH": str(target)},
                             capture_output=True, text=True)
    assert (version.returncode, version.stdout.strip()) == (0, "0.25.1")
