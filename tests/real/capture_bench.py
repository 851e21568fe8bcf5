"""Capture what the REAL `vllm bench serve` writes and prints against the stand-in server,
into tests/fixtures/vllm_bench_real/<case>/ (see the README there).

Each case runs the soak's own argv (soak_bench.bench_command) with a small load (bench_rig.LOAD)
and keeps: ``result.json`` (the file the bench saved, if any; lists cut to the first 8
entries), ``output.log`` (stdout and stderr together) and ``run.json`` (argv, exit status, the
environment given beyond PATH/HOME/LANG, who ran it).

Usage (root, from the repository root, with the project venv):
``python tests/real/capture_bench.py REAL_VENV [SCRATCH_DIR]``. REAL_VENV holds the real
vllm==0.25.1 with its dependencies; it is only read.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_rig as rig  # noqa: E402

OUT = rig.ROOT / "tests" / "fixtures" / "vllm_bench_real"
KEEP = 8  # per-request entries kept
DETAILED = ["--save-detailed"]


def cut(result: dict) -> tuple[dict, list[str]]:
    """``result`` with every list cut to KEEP entries; and the keys that were cut."""
    cut_keys = sorted(k for k, v in result.items() if isinstance(v, list) and len(v) > KEEP)
    return {k: v[:KEEP] if k in cut_keys else v for k, v in result.items()}, cut_keys


def capture(name: str, argv: list[str], env: dict, result: Path, *, user: str = "root",
            nobody_needs: list[Path] | None = None) -> dict:
    rc, log = rig.run_bench(argv, env, nobody_needs=nobody_needs)
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)  # and OUT with it, the first time
    (out / "output.log").write_text(log)
    data = rig.read_result(result)
    cut_keys = []
    if data is not None:
        data, cut_keys = cut(data)
        (out / "result.json").write_text(json.dumps(data, indent=1) + "\n")
    extra_env = {k: v for k, v in env.items() if k not in ("PATH", "HOME", "LANG")}
    run = {"argv": argv, "exit_status": rc, "user": user, "env": extra_env, "result_file": str(result),
           "result_saved": data is not None, "lists_cut_to_8": cut_keys}
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    last = log.strip().splitlines()[-1] if log.strip() else "(no output)"
    print(f"{name}: exit {rc}, result {'saved' if data is not None else 'none'}; last line: {last[:200]}",
          flush=True)
    counts = {k: data.get(k) for k in ("completed", "failed")} if data else {}
    return {"exit_status": rc, "result_saved": data is not None, **counts, "last_line": last[:300]}


def machine() -> str:
    """CPU model and count, kernel, Python: no GPU here."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"{model} x{os.cpu_count()}, {platform.system()} {platform.release()}, Python {platform.python_version()}, no GPU"


def main(argv: list[str]) -> int:
    real = Path(argv[0]).resolve()
    scratch = Path(argv[1] if len(argv) > 1 else "/tmp/vllm-bench-capture").resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    scratch.chmod(0o755)  # nobody walks through it to its own directories (case e)
    venv, commit = rig.standin_venv(scratch, "HEAD")
    model = rig.make_model_dir(real, scratch / "models" / rig.MODEL_NAME)
    private = rig.make_model_dir(real, scratch / "private" / rig.MODEL_NAME)
    private.chmod(0o700)  # root's, unreadable to nobody
    bench = real / "bin" / "vllm"

    def case_dirs(name: str, owner: int | None = None) -> tuple[Path, Path]:
        results, home = scratch / name / "bench", scratch / name / "home"
        for path in (results, home):
            path.mkdir(parents=True)
            if owner is not None:
                os.chown(path, owner, owner)
        (scratch / name).chmod(0o755)
        return results, home

    runs = {}
    with rig.standin_server(venv, scratch, model) as url:
        # The failing cases run twice, the second time with --save-detailed: only that file
        # carries the error texts.
        for name, extra, key, served, model_path in (
                ("a_success", [], rig.API_KEY, rig.SERVED_NAME, model),
                ("b_save_detailed", DETAILED, rig.API_KEY, rig.SERVED_NAME, model),
                ("c_wrong_api_key", [], "sk-wrong-key", rig.SERVED_NAME, model),
                ("c_wrong_api_key_detailed", DETAILED, "sk-wrong-key", rig.SERVED_NAME, model),
                ("d_wrong_model", [], rig.API_KEY, "no-such-model", model),
                ("d_wrong_model_detailed", DETAILED, rig.API_KEY, "no-such-model", model),
                ("e_no_tokenizer", [], rig.API_KEY, rig.SERVED_NAME, scratch / "missing" / rig.MODEL_NAME)):
            results, home = case_dirs(name)
            cmd = rig.soak_argv(bench.parent.parent, url, model_path, results, "result.json",
                                served_model_name=served) + extra
            runs[name] = capture(name, cmd, rig.bench_env(home, key), results / "result.json")
        name = "e_unreadable_tokenizer"
        results, home = case_dirs(name, owner=65534)
        cmd = rig.soak_argv(real, url, private, results, "result.json")
        runs[name] = capture(name, cmd, rig.bench_env(home, rig.API_KEY), results / "result.json", user="nobody",
                             nobody_needs=[real, rig.python_home(real)])
    for name, extra in (("f_nothing_listening", []), ("f_nothing_listening_detailed", DETAILED)):
        results, home = case_dirs(name)
        cmd = rig.soak_argv(real, f"http://127.0.0.1:{rig.free_port()}", model, results, "result.json") + extra
        runs[name] = capture(name, cmd, rig.bench_env(home, rig.API_KEY), results / "result.json")

    versions = rig.package_versions(real, ("vllm", "torch", "transformers", "tokenizers", "aiohttp"))
    summary = {"captured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": machine(),
               "real": versions, "real_venv": str(real), "standin_commit": commit, "scratch": str(scratch),
               "load": rig.LOAD, "cases": runs}
    (OUT / "capture.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(versions))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
