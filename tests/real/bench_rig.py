"""The real `vllm bench serve` against the stand-in server: the pieces that
tests/real/capture_bench.py (the captured fixtures) and tests/real/check_real.py
(`make check-real`) share.

- the stand-in vLLM as committed (``git archive HEAD``, so work in progress in the checkout
  does not leak in), packaged by tests/fixtures/wheels/build.py and installed ``--no-deps``
  with the stand-in torch, the fixed cuDNN and the real nvidia-ml-py and pyyaml into a
  venv of its own;
- the fake NVML (tests/fixtures/nvml), so the stand-in sees an RTX PRO 6000;
- a model directory holding only a small tokenizer (WordLevel over ``w0..w4999``) made with
  the real venv's ``tokenizers``/``transformers``: the bench needs a local tokenizer, and
  the soak names it by the model path;
- the bench's argv from the soak's own ``bench_command``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for entry in (ROOT, ROOT / "collections"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import SoakConfig  # noqa: E402
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_bench import bench_command  # noqa: E402
from tests.fixtures.nvml.build import PROFILES_DIR, build_fake_nvml  # noqa: E402
from tests.fixtures.wheels.build import (  # noqa: E402
    build_vllm_wheel,
    build_wheelhouse,
    fetch_pypi_wheels,
)

STANDIN_PATH = "tests/fixtures/vllm_standin"
# What a fixed node runs: the stand-in vllm and torch, the cuDNN with the fix, real NVML bindings.
STANDIN_WHEELS = ("vllm-0.25.1-", "torch-2.11.0-", "nvidia_cudnn_cu13-9.24.0.43-", "nvidia_ml_py-", "pyyaml-")
# A scaled-down stand-in: loads in half a second, 50k tokens/s, fixed seed.
STANDIN_ENV = {
    "VLLM_STANDIN_LOAD_SECONDS": "0.5",
    "VLLM_STANDIN_TOKENS_PER_SECOND": "50000",
    "VLLM_STANDIN_STEP_SECONDS": "0.005",
    "VLLM_STANDIN_SEED": "7",
}
MODEL_NAME = "qwen3.6-35b-a3b-fp8"  # a model path without "nvfp4": no fault on this profile
SERVED_NAME = "qwen-test"
API_KEY = "sk-check-real-0001"
# The small load of every run: 8 prompts, 4 at a time, 32 tokens in, 16 out.
LOAD = {"num_prompts": 8, "concurrency": 4, "input_len": 32, "output_len": 16, "seed": 1}

TOKENIZER_PROGRAM = """\
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {f"w{i}": i for i in range(5000)}
vocab["[UNK]"] = 5000
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[UNK]").save_pretrained(sys.argv[1])
"""


def isolated_env() -> dict:
    """This machine's pip settings add find-links, indexes and a torch cap: shut them out, and
    keep any stand-in NVML (tests build one) off the loader's path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "UV_", "VLLM_")) and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("env", isolated_env())
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


def standin_source(dest: Path, rev: str | None) -> tuple[Path, str]:
    """The stand-in's source and a line saying which: as committed at ``rev`` (extracted under
    ``dest``), or the checkout's working tree for None."""
    if rev is None:
        head = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], check=True).stdout.strip()
        dirty = run(["git", "-C", ROOT, "status", "--porcelain", "--", STANDIN_PATH], check=True).stdout.strip()
        state = f"{len(dirty.splitlines())} file(s) changed since" if dirty else "as committed at"
        return ROOT / STANDIN_PATH / "src", f"working tree ({state} {head})"
    commit = run(["git", "-C", ROOT, "rev-parse", rev], check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, STANDIN_PATH],
                             capture_output=True, check=True).stdout
    shutil.rmtree(dest, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / STANDIN_PATH / "src", commit


def standin_venv(scratch: Path, rev: str | None = "HEAD") -> tuple[Path, str]:
    """A venv with the stand-in vllm (``--no-deps``) from standin_source; (venv, which source)."""
    src, which = standin_source(scratch / "standin-src", rev)
    wheelhouse = scratch / "standin-wheels"
    build_wheelhouse(wheelhouse)
    wheels = [build_vllm_wheel(wheelhouse, source=src), *fetch_pypi_wheels()]
    wheels += [w for w in wheelhouse.glob("*.whl") if w.name.startswith(STANDIN_WHEELS[1:3])]
    venv = scratch / "standin-venv"
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    proc = run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-deps", "--no-index", *[w for w in wheels if w.name.startswith(STANDIN_WHEELS)]], timeout=600)
    if proc.returncode:
        raise SystemExit(f"installing the stand-in into {venv} failed:\n{proc.stdout}\n{proc.stderr}")
    return venv, which


def make_model_dir(real_venv: Path, path: Path) -> Path:
    """``path`` holding only a tokenizer the real bench loads (tokenizer.json and its config)."""
    path.mkdir(parents=True, exist_ok=True)
    proc = run([real_venv / "bin" / "python", "-c", TOKENIZER_PROGRAM, path], timeout=300)
    if proc.returncode:
        raise SystemExit(f"making the tokenizer in {path} failed:\n{proc.stderr[-3000:]}")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def standin_server(venv: Path, scratch: Path, model: Path, *, api_key: str = API_KEY, timeout: float = 60):
    """The stand-in `vllm serve` on a free loopback port with the fake NVML; yields its base URL."""
    nvml = build_fake_nvml(scratch / "nvml").parent
    port = free_port()
    env = {**isolated_env(), **STANDIN_ENV, "LD_LIBRARY_PATH": str(nvml), "PYTHONUNBUFFERED": "1",
           "FAKE_NVML_CONFIG": str(PROFILES_DIR / "rtx_pro_6000.conf")}
    log_path = scratch / f"serve-{port}.log"
    cmd = [venv / "bin" / "vllm", "serve", model, "--host", "127.0.0.1", "--port", port,
           "--served-model-name", SERVED_NAME, "--api-key", api_key, "--max-model-len", "8192",
           "--kv-cache-dtype", "fp8"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"stand-in vllm serve exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            if time.monotonic() > deadline:
                raise SystemExit(f"stand-in vllm serve not ready in {timeout} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def soak_config(bench_venv: Path, base_url: str, model: Path | str, state_dir: Path, **overrides) -> SoakConfig:
    """The soak's configuration for LOAD, as roles/soak_gate gives it: the model path (which
    names the tokenizer) and the first served name, no --tokenizer; ``overrides`` on top."""
    settings = {"unit": "vllm@check-real", "state_dir": str(state_dir), "duration_s": 60, "venv": str(bench_venv),
                "base_url": base_url, "model": str(model), "served_model_name": SERVED_NAME,
                "concurrency": LOAD["concurrency"], "input_len": LOAD["input_len"], "output_len": LOAD["output_len"],
                "num_prompts": LOAD["num_prompts"], **overrides}
    cfg = SoakConfig(**settings)
    cfg.validate()
    return cfg


def soak_argv(bench_venv: Path, base_url: str, model: Path | str, result_dir: Path, result_file: str,
              *, served_model_name: str = SERVED_NAME) -> list[str]:
    """The soak's own argv (``bench_command``) for LOAD."""
    cfg = soak_config(bench_venv, base_url, model, result_dir.parent, served_model_name=served_model_name)
    return bench_command(cfg, LOAD["num_prompts"], LOAD["seed"], str(result_dir), result_file)


def bench_env(home: Path, api_key: str | None) -> dict:
    """What the soak's BenchLoad gives the bench: its own environment with loopback kept off any
    proxy and the key as OPENAI_API_KEY; here a fixed, small one, HOME a directory of its own."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "no_proxy": "127.0.0.1,localhost,::1", "NO_PROXY": "127.0.0.1,localhost,::1"}
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    return env


# Runs as root in a mount namespace of its own (unshare): /root (0700 here, and holding the
# real venv's Python) is covered by a 0755 tmpfs with only the directories the bench needs
# bound back, then becomes nobody and runs the bench. Arguments: the directories, "--", argv.
AS_NOBODY = """\
import os, subprocess, sys, tempfile
sep = sys.argv.index("--")
dirs, argv = sys.argv[1:sep], sys.argv[sep + 1:]
stage = tempfile.mkdtemp(prefix="as-nobody-")
for i, path in enumerate(dirs):
    os.mkdir(f"{stage}/{i}")
    subprocess.run(["mount", "--bind", path, f"{stage}/{i}"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/root"], check=True)
for i, path in enumerate(dirs):
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "--bind", f"{stage}/{i}", path], check=True)
    subprocess.run(["umount", f"{stage}/{i}"], check=True)
    os.rmdir(f"{stage}/{i}")
os.rmdir(stage)
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
os.execv(argv[0], argv)
"""


def as_nobody(argv: list[str], needed: list[Path]) -> list[str]:
    """``argv`` run as nobody, with the directories under /root in ``needed`` reachable."""
    under_root = sorted({str(p) for p in needed if Path(p).is_relative_to("/root")})
    return ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", AS_NOBODY,
            *under_root, "--", *argv]


def python_home(venv: Path) -> Path:
    """The installation a venv's Python comes from (its ``home`` in pyvenv.cfg)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).resolve().parent
    raise SystemExit(f"{venv}/pyvenv.cfg names no home")


def run_bench(argv: list[str], env: dict, *, nobody_needs: list[Path] | None = None,
              timeout: float = 600) -> tuple[int, str]:
    """(exit status, stdout and stderr together) of one bench run; as nobody when
    ``nobody_needs`` lists the directories it must reach."""
    cmd = as_nobody(argv, nobody_needs) if nobody_needs is not None else argv
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout


def read_result(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def package_versions(venv: Path, names: tuple[str, ...]) -> dict:
    program = ("import importlib.metadata as m, json, sys\n"
               "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    return json.loads(run([venv / "bin" / "python", "-c", program, *names], check=True, timeout=120).stdout)
