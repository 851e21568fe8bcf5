"""`make check-real`: cudnn_facts' and gpu_facts' logic against the real wheels, not the stand-ins.

Opt-in (it downloads from PyPI; never part of `make test`). In a scratch directory:

1. a venv with the real ``nvidia-cudnn-cu13==9.24.0.43`` (``--no-deps``: cudnnGetVersion needs
   none of cuBLAS, and the fleet's release venv gets its cuBLAS from torch) and the real
   ``nvidia-ml-py``, installed with this machine's pip configuration shut out;
2. ``collect_cudnn_facts`` on it: the real libcudnn.so.9 must report 92400 (9.24.0);
3. ``collect_gpu_facts`` run by that venv's Python with the real pynvml: on a machine without
   an NVIDIA driver, a clean ``library_not_found`` answer, never a traceback;
4. a copy of the venv's cuDNN with ``libcudnn_graph.so.9`` removed: whatever the library then
   does, cudnn_facts reports it (a version or a library_error) and does not fail.

Prints one line per check and exits 1 if one failed. Usage (from the repository root, with the
project venv): ``python tests/real/check_real.py [SCRATCH_DIR]``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import collect_cudnn_facts  # noqa: E402

CUDNN_PIN = "nvidia-cudnn-cu13==9.24.0.43"
GPU_UTILS = ROOT / "plugins" / "module_utils" / "gpu.py"


def isolated_env() -> dict:
    """This machine's pip settings add find-links, indexes and a torch cap: shut them out, and
    keep any stand-in NVML (tests build one) off the loader's path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "UV_")) and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=isolated_env(), **kwargs)


def make_venv(path: Path, *requirements: str) -> None:
    if not (path / "bin" / "python").exists():
        proc = run([sys.executable, "-m", "venv", path], timeout=300)
        if proc.returncode:
            raise SystemExit(f"python -m venv {path} failed: {proc.stderr.strip()}")
    proc = run([path / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-deps", "--only-binary=:all:", *requirements], timeout=1800)
    if proc.returncode:
        raise SystemExit(f"pip install {' '.join(requirements)} into {path} failed:\n{proc.stdout}\n{proc.stderr}")


def gpu_facts(venv: Path) -> dict:
    """collect_gpu_facts, loaded by path into the venv's own Python (real pynvml there)."""
    program = ("import importlib.util, json, sys\n"
               "spec = importlib.util.spec_from_file_location('gpu', sys.argv[1])\n"
               "gpu = importlib.util.module_from_spec(spec); spec.loader.exec_module(gpu)\n"
               "print(json.dumps(gpu.collect_gpu_facts()))\n")
    proc = run([venv / "bin" / "python", "-I", "-c", program, GPU_UTILS], timeout=120)
    if proc.returncode:
        return {"error": "traceback", "reason": proc.stderr.strip().splitlines()[-1] if proc.stderr else "no output"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    scratch = Path(argv[0] if argv else tempfile.mkdtemp(prefix="vllm-fleet-check-real-")).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    failures = []

    def check(ok: bool, line: str) -> None:
        print(("ok   " if ok else "FAIL ") + line, flush=True)
        if not ok:
            failures.append(line)

    real = scratch / "real"
    make_venv(real, CUDNN_PIN, "nvidia-ml-py")
    versions = run([real / "bin" / "python", "-m", "pip", "list", "--format=freeze"], timeout=120).stdout.split()
    print("installed: " + " ".join(v for v in versions if v.startswith(("nvidia-", "pip=="))), flush=True)

    facts = collect_cudnn_facts(str(real))
    check(facts["library_version_raw"] == 92400 and facts["library_version"] == "9.24.0",
          f"cudnn_facts: {facts['library_path']} reports {facts['library_version_raw']} "
          f"({facts['library_version']}); wheels {[(w['name'], w['version']) for w in facts['wheels']]}; "
          f"status {facts['status']}: {facts['message']}")

    gpu = gpu_facts(real)
    check(gpu.get("available") is False and gpu.get("error") in ("library_not_found", "driver_not_loaded"),
          f"gpu_facts (real nvidia-ml-py, no driver here): available={gpu.get('available')} "
          f"error={gpu.get('error')}: {gpu.get('reason')}")

    broken = scratch / "broken"
    make_venv(broken, CUDNN_PIN)  # from pip's cache: no second download
    (graph,) = broken.glob("lib/python*/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9")
    graph.unlink()
    try:
        facts = collect_cudnn_facts(str(broken))
    except Exception as exc:  # the check is that this does not happen
        check(False, f"cudnn_facts without libcudnn_graph.so.9 raised {type(exc).__name__}: {exc}")
    else:
        reported = facts["library_error"] or facts["library_version"]
        check(bool(reported) and facts["status"] is not None,
              f"cudnn_facts without libcudnn_graph.so.9: library_version={facts['library_version']} "
              f"library_error={facts['library_error']}; status {facts['status']}: {facts['message']}")
    shutil.rmtree(broken, ignore_errors=True)

    print(f"check-real: {'FAILED' if failures else 'passed'} ({scratch})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
