"""`make check-real`: the project's logic against the real wheels, not the stand-ins.

Opt-in (it downloads from PyPI, ~10 GB; never part of `make test`). In a scratch directory:

1. a venv with the real ``nvidia-cudnn-cu13==9.24.0.43`` (``--no-deps``: cudnnGetVersion needs
   none of cuBLAS, and the fleet's release venv gets its cuBLAS from torch) and the real
   ``nvidia-ml-py``, installed with this machine's pip configuration shut out;
2. ``collect_cudnn_facts`` on it: the real libcudnn.so.9 must report 92400 (9.24.0);
3. ``collect_gpu_facts`` run by that venv's Python with the real pynvml: on a machine without
   an NVIDIA driver, a clean ``library_not_found`` answer, never a traceback;
4. a copy of the venv's cuDNN with ``libcudnn_graph.so.9`` removed: whatever the library then
   does, cudnn_facts reports it (a version or a library_error) and does not fail;
5. a venv with the real ``vllm==0.25.1`` and its dependencies (the wheel fetched ``--no-deps``
   and refused unless its sha256 is the one catalogue/vllm_contract.json records, then
   installed from that file; a venv already holding exactly that version is reused);
6. the contract: ``scripts/vllm-contract --venv <that venv> --check`` (catalogue/vllm_contract.json
   must be what the wheel gives);
7. the real ``vllm bench serve``, run by the soak's own ``BenchLoad`` (the soak's exact argv,
   ``bench_command``) against the stand-in server (tests/real/bench_rig.py); the soak's parser
   (``BenchLoad.poll``, ``bench_summary``, ``aggregate_bench``) reads the real result file;
8. the stand-in's own bench, run the same way, compared with the real one key by key, with and
   without ``--save-detailed``; then the real bench made to deliver no load (a wrong key, a
   model name not served, nothing listening, no tokenizer, a tokenizer nobody cannot read): the
   soak's diagnosis must name each cause, and its check_tokenizer must pass the readable model
   directory and refuse the 0700 one. The bench runs as nobody, the soak's run_as (bench_rig's
   as_nobody: /root, 0700 here, holds the venvs' Python);
9. every shipped profile (profiles/*.yml) rendered by serve_config.build with the role
   arguments of roles/vllm_service/tasks/profile.yml, and the file given to the real
   ``vllm serve`` argument parser (``vllm.entrypoints.cli.main`` with its ``serve`` dispatch
   replaced by a probe): each value must come out as the profile means it; and a negative
   control, a flag 0.25.1 does not have, must be refused (exit 2).

Prints one line per check and exits 1 if one failed. Usage (root, from the repository root,
with the project venv): ``python tests/real/check_real.py [--standin-rev REV] [SCRATCH_DIR]``;
the stand-in is the checkout's working tree unless ``--standin-rev`` names a commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_rig as rig  # noqa: E402
import yaml  # noqa: E402
from jinja2 import StrictUndefined  # noqa: E402
from jinja2.nativetypes import NativeEnvironment  # noqa: E402

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import collect_cudnn_facts  # noqa: E402
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import build, size_value  # noqa: E402
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_bench import (  # noqa: E402
    BENCH_SUMMARY_KEYS,
    BenchLoad,
    aggregate_bench,
    check_tokenizer,
    log_tail,
)

ROOT = rig.ROOT
run = rig.run
CUDNN_PIN = "nvidia-cudnn-cu13==9.24.0.43"
GPU_UTILS = ROOT / "plugins" / "module_utils" / "gpu.py"
# The wheel the contract was taken from (scripts/vllm-contract pins it): its version and sha256.
_PIN = json.loads((ROOT / "catalogue" / "vllm_contract.json").read_text())["vllm"]
VLLM_VERSION, VLLM_WHEEL_SHA256 = _PIN["version"], _PIN["sha256"]
CONTRACT = ROOT / "scripts" / "vllm-contract"
PROFILE_TASKS = ROOT / "roles" / "vllm_service" / "tasks" / "profile.yml"
ROLE_DEFAULTS = (ROOT / "roles" / "fleet_defaults" / "defaults" / "main.yml",
                 ROOT / "roles" / "vllm_service" / "defaults" / "main.yml")
INSTANCE = {"name": "gpu0", "gpu": 0, "port": 8000}  # the instance the profiles are rendered for
# A flag vLLM 0.25.1 does not have (it was removed): the real parser must refuse the file.
NOT_A_FLAG = ("swap-space", 4)
BENCH_TIMEOUT_S = 300

# Runs in the real venv: `vllm serve --config FILE` through vLLM's own CLI main() for each FILE,
# with the serve subcommand's dispatch replaced by a recorder (nothing is served). The
# platform is vLLM's CPU one, as `vllm bench` picks without a GPU: the unspecified platform
# raises "Failed to infer device type" while building the parser.
SERVE_PARSER_PROBE = """\
import contextlib, io, json, sys
import vllm.entrypoints.cli.serve as serve
from vllm import platforms
from vllm.platforms.cpu import CpuPlatform
platforms.current_platform = CpuPlatform()
from vllm.entrypoints.cli.main import main
seen = {}
original = serve.ServeSubcommand.subparser_init
def subparser_init(self, subparsers):
    parser = original(self, subparsers)
    seen["options"] = {o: a.dest for a in parser._actions for o in a.option_strings}
    seen["parser"] = parser
    return parser
def record(args):
    seen["namespace"] = {k: v for k, v in vars(args).items() if k != "dispatch_function"}
serve.ServeSubcommand.subparser_init = subparser_init
serve.ServeSubcommand.cmd = staticmethod(record)
out = {}
for path in sys.argv[1:]:
    seen.pop("namespace", None)
    sys.argv = ["vllm", "serve", "--config", path]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            main()
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:
        status, err = 1, io.StringIO(f"{type(exc).__name__}: {exc}")
    out[path] = {"status": status, "stderr": err.getvalue()[-2000:], "namespace": seen.get("namespace"),
                 "options": seen.get("options"), "argv": seen["parser"].load_config_file(path)}
print("PROBE " + json.dumps(out, default=repr))
"""


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


# --------------------------------------------------------------------------- the real vLLM

def installed_vllm(venv: Path) -> str | None:
    if not (venv / "bin" / "python").exists():
        return None
    proc = run([venv / "bin" / "python", "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
               timeout=120)
    return proc.stdout.strip() if proc.returncode == 0 else None


def fetch_vllm_wheel(wheels: Path) -> Path:
    """The pinned wheel, fetched and refused as scripts/vllm-contract does (one pin, one fetcher)."""
    loader = importlib.machinery.SourceFileLoader("vllm_contract", str(CONTRACT))
    spec = importlib.util.spec_from_loader("vllm_contract", loader)
    contract = importlib.util.module_from_spec(spec)
    loader.exec_module(contract)
    return contract.fetch_wheel(wheels, sys.executable)


def real_vllm_venv(scratch: Path) -> tuple[Path, str]:
    """The venv with the real vllm==0.25.1 and its dependencies (~10 GB, ~5 min the first time)."""
    venv = scratch / "vllm"
    if installed_vllm(venv) == VLLM_VERSION:
        return venv, f"reused {venv} (holds vllm {VLLM_VERSION})"
    wheel = fetch_vllm_wheel(scratch / "wheels")
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    proc = run([sys.executable, "-m", "venv", venv], timeout=300)
    if proc.returncode == 0:
        proc = run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    wheel], timeout=3600)
    if proc.returncode:
        raise SystemExit(f"installing {wheel.name} with its dependencies into {venv} failed:\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return venv, f"installed {wheel.name} (sha256 {VLLM_WHEEL_SHA256[:12]}...) into {venv} " \
                 f"in {time.monotonic() - started:.0f} s"


def check_contract(venv: Path, scratch: Path) -> tuple[bool, str]:
    if not CONTRACT.exists():
        return False, f"contract: {CONTRACT.relative_to(ROOT)} does not exist (issue 31 item 1): not checked"
    proc = run([sys.executable, CONTRACT, "--venv", venv, "--check", "--cache-dir", scratch / "wheels"],
               timeout=1800)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode == 0:
        return True, f"contract: catalogue/vllm_contract.json is what the wheel gives ({text.splitlines()[-1:]})"
    return False, f"contract: scripts/vllm-contract --check exited {proc.returncode}:\n{text[-6000:]}"


# --------------------------------------------------------------------------- the bench

def nobody_popen(needs: list[Path]):
    """subprocess.Popen for BenchLoad: the bench as nobody through bench_rig.as_nobody (the
    venvs' Python lives under /root, which is 0700 here) instead of subprocess's user switch."""
    def popen(cmd, *, user=None, group=None, extra_groups=None, **kwargs):  # noqa: ARG001 (as_nobody switches)
        return subprocess.Popen(rig.as_nobody(cmd, needs), **kwargs)
    return popen


def bench_once(cfg, state_dir: Path, needs: list[Path]) -> tuple[dict | None, dict | None, list[dict]]:
    """One run of the soak's BenchLoad, as the soak runs it (run_as nobody, its scratch
    directory): (the result file as the bench wrote it, what the soak's parser made of it, the
    soak's diagnosis of a run that completed nothing: BenchLoad.failures)."""
    load = BenchLoad(cfg, str(state_dir), popen=nobody_popen(needs))
    try:
        load.start()
        deadline = time.monotonic() + BENCH_TIMEOUT_S
        while load.proc is not None and load.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if load.proc is not None and load.proc.poll() is None:
            return None, None, [{"cause": "timeout", "message": f"no result in {BENCH_TIMEOUT_S} s; last output: "
                                                                f"{log_tail(load.log('run-001'))}"}]
        raw = rig.read_result(Path(load.scratch) / "run-001.raw.json") if load.scratch else None
        summary = load.poll()  # reads the file and removes it
        return raw, summary, load.failures
    finally:
        load.close()


def nobody_run(needs: list[Path]):
    """subprocess.run for the soak's check_tokenizer, as nobody the same way."""
    def run_as_nobody(cmd, *, user=None, group=None, extra_groups=None, **kwargs):  # noqa: ARG001
        return subprocess.run(rig.as_nobody(cmd, needs), **kwargs)
    return run_as_nobody


def messages(failures: list[dict]) -> str:
    return "; ".join(f["message"] for f in failures) or "no failure recorded"


def json_type(value) -> str:
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def compare_keys(real: dict, standin: dict) -> list[str]:
    """Differences of the stand-in's result from the real one: keys, and JSON types."""
    diffs = []
    if set(real) - set(standin):
        diffs.append(f"only in the real file: {sorted(set(real) - set(standin))}")
    if set(standin) - set(real):
        diffs.append(f"only in the stand-in's: {sorted(set(standin) - set(real))}")
    for key in sorted(set(real) & set(standin)):
        if json_type(real[key]) != json_type(standin[key]):
            diffs.append(f"{key}: real {json_type(real[key])} {real[key]!r:.60}, "
                         f"stand-in {json_type(standin[key])} {standin[key]!r:.60}")
    return diffs


# --------------------------------------------------------------------------- the profiles

def role_args() -> dict:
    """The role_args of vllm_service's serve_config task, rendered for INSTANCE with the roles'
    defaults (what a node with no overrides gets)."""
    tasks = yaml.safe_load(PROFILE_TASKS.read_text())
    (task,) = [t for t in tasks if "vllm_fleet.fleet.serve_config" in t]
    variables = {"item": INSTANCE}
    for path in ROLE_DEFAULTS:
        variables.update(yaml.safe_load(path.read_text()))
    env = NativeEnvironment(undefined=StrictUndefined)

    def render(value):
        for _ in range(5):  # defaults that name other defaults
            if not (isinstance(value, str) and "{{" in value):
                break
            value = env.from_string(value).render(variables)
        return value

    return {key: render(value) for key, value in task["vllm_fleet.fleet.serve_config"]["role_args"].items()}


def intended(key: str, value, options: dict) -> tuple[str | None, object]:
    """(namespace attribute, value) that config entry ``key: value`` should give."""
    if key.startswith("no-") and value is True and f"--{key}" in options:
        return options[f"--{key}"], False
    dest = options.get(f"--{key}")
    if isinstance(value, str) and size_value(value) is not None and value.strip().lower()[-1:] in "kmgt":
        return dest, size_value(value)
    return dest, value


def check_parsed(config: dict, probe: dict) -> list[str]:
    """Each config entry against the real parser's namespace: the differences."""
    if probe["status"] != 0 or probe["namespace"] is None:
        return [f"vllm serve's parser exited {probe['status']}: {probe['stderr'].strip()[-600:]}"]
    problems = []
    for key, value in config.items():
        dest, want = intended(key, value, probe["options"])
        if dest is None:
            problems.append(f"{key}: no --{key} in the real parser")
        elif probe["namespace"].get(dest) != want:
            problems.append(f"{key}: we mean {want!r}, the real parser gives {dest}={probe['namespace'].get(dest)!r}")
    return problems


def serve_parser_probe(venv: Path, files: list[Path]) -> dict:
    proc = run([venv / "bin" / "python", "-c", SERVE_PARSER_PROBE, *files], timeout=600)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    if proc.returncode or not marker:
        raise SystemExit(f"the serve parser probe failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(marker[0][len("PROBE "):])


# --------------------------------------------------------------------------- the checks

def bench_checks(check, scratch: Path, vllm: Path, standin: Path) -> None:
    """The real bench through the soak's own code against the stand-in server: its result read by
    the soak's parser, compared key by key with the stand-in bench's, and each way it can deliver
    no load diagnosed by the soak."""
    model = rig.make_model_dir(vllm, scratch / "models" / rig.MODEL_NAME)
    private = rig.make_model_dir(vllm, scratch / "private" / rig.MODEL_NAME)
    private.chmod(0o700)  # root's: the probe user cannot read it
    soak_scratch = scratch / "soak-scratch"  # the soak's scratch_dir: root's, 0711
    shutil.rmtree(soak_scratch, ignore_errors=True)
    # What the soak must say when the real bench delivers no load (soak_bench.diagnose):
    # (what is wrong, the soak's settings that differ, the cause it must give).
    broken = (("a wrong API key", {"api_key": "sk-wrong-key-0000"}, "unauthorized"),
              ("a model name the server does not serve", {"served_model_name": "no-such-model"}, "wrong_model"),
              ("nothing listening", {"base_url": f"http://127.0.0.1:{rig.free_port()}"}, "could_not_connect"),
              ("no tokenizer at the model path", {"model": str(scratch / "missing" / rig.MODEL_NAME)},
               "no_tokenizer"),
              ("a model directory the probe user cannot read", {"model": str(private)}, "no_tokenizer"))
    results, diagnosed = {}, []
    with rig.standin_server(standin, scratch, model) as url:
        def soak(venv: Path, name: str, **overrides) -> tuple:
            state = scratch / "soak" / name
            shutil.rmtree(state, ignore_errors=True)
            settings = {"base_url": url, "model": model, "api_key": rig.API_KEY, "run_as": "nobody",
                        "scratch_dir": str(soak_scratch), **overrides}
            cfg = rig.soak_config(venv, settings.pop("base_url"), settings.pop("model"), state, **settings)
            return cfg, bench_once(cfg, state, [venv, rig.python_home(venv), model, private, soak_scratch])

        for client, venv in (("real", vllm), ("stand-in", standin)):
            for label, extra in (("plain", ()), ("detailed", ("--save-detailed",))):
                results[client, label] = soak(venv, f"{client}-{label}", bench_args=list(extra))[1]
        for i, (label, overrides, cause) in enumerate(broken):
            diagnosed.append((label, cause, *soak(vllm, f"broken-{i}", **overrides)))

    raw, summary, failures = results["real", "plain"]
    n = rig.LOAD["num_prompts"]
    check(summary is not None and summary.get("completed") == n and summary.get("failed") == 0,
          "real vllm bench serve, the soak's argv by BenchLoad as nobody: "
          + (f"completed {summary.get('completed')}/{n}, failed {summary.get('failed')}, "
             f"{summary.get('total_token_throughput', 0):.0f} tokens/s" if summary else
             f"no result: {messages(failures)}"))
    if raw is not None and summary is not None:
        missing = [k for k in BENCH_SUMMARY_KEYS if k not in raw]
        agg = aggregate_bench([summary])
        check(not missing and agg is not None and agg["completed"] == n and agg["total_output_tokens"] > 0,
              f"the soak's parser on the real file: bench_summary kept {len(summary) - 1} keys"
              + (f", MISSING {missing}" if missing else "")
              + (f"; aggregate_bench: runs {agg['runs']}, completed {agg['completed']}, "
                 f"{agg['total_token_throughput']:.0f} tokens/s" if agg else "; aggregate_bench: None"))
    for label in ("plain", "detailed"):
        real_raw, standin_raw = results["real", label][0], results["stand-in", label][0]
        if real_raw is None or standin_raw is None:
            client = "real" if real_raw is None else "stand-in"
            check(False, f"bench keys ({label}): no result from the {client} bench: "
                         f"{messages(results[client, label][2])}")
            continue
        diffs = compare_keys(real_raw, standin_raw)
        check(not diffs, f"bench keys ({label}{', --save-detailed' if label == 'detailed' else ''}): "
                         f"the stand-in's {len(standin_raw)} against the real {len(real_raw)}"
                         + ("; the same keys and types" if not diffs else ": " + "; ".join(diffs)))
    plain, detailed = results["real", "plain"][0], results["real", "detailed"][0]
    if plain is not None and detailed is not None:  # the comparison can tell two real files apart
        diffs = compare_keys(detailed, plain)
        check(bool(diffs), f"negative control: the key comparison of the real --save-detailed file against the "
                           f"real plain one reports {'; '.join(diffs) or 'nothing'}")

    for label, cause, _, (_, summary, failures) in diagnosed:
        causes = [f["cause"] for f in failures]
        check(summary is None and causes == [cause],
              f"the soak's diagnosis of the real bench with {label}: {causes or 'none'} (wanted [{cause!r}]): "
              f"{messages(failures)[:400]}")
    # Before any load the soak asks, as the probe user, whether the tokenizer can be read.
    cfg = diagnosed[-1][2]
    python = [Path(sys.prefix), rig.python_home(Path(sys.prefix))]
    unreadable = check_tokenizer(cfg, run=nobody_run([*python, private]))
    readable = check_tokenizer(dataclasses.replace(cfg, model=str(model)), run=nobody_run([*python, model]))
    check(readable is None and unreadable is not None and unreadable["cause"] == "no_tokenizer",
          f"the soak's check_tokenizer as nobody: the readable model directory "
          f"{'passes' if readable is None else 'FAILS: ' + readable['message']}; the 0700 one: "
          f"{unreadable['message'][:300] if unreadable else 'PASSES'}")


def profile_checks(check, scratch: Path, vllm: Path) -> None:
    """Every shipped profile, rendered as the role renders it, through the real `vllm serve` parser."""
    schema = yaml.safe_load((ROOT / "catalogue" / "vllm_serve_args.yml").read_text())
    extra = role_args()
    configs = {}
    for path in sorted((ROOT / "profiles").glob("*.yml")):
        built = build(schema, yaml.safe_load(path.read_text()), role_args=extra, models_dir="/opt/vllm-fleet/models",
                      header=f"check-real: {path.name} for instance {INSTANCE['name']}")
        target = scratch / "configs" / f"{path.stem}.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(built["content"])
        configs[str(target)] = (path, built["config"])
    bad_path, (_, bad_base) = next(iter(configs.items()))
    bad = {**bad_base, NOT_A_FLAG[0]: NOT_A_FLAG[1]}
    bad_file = scratch / "configs" / "negative-control.yaml"
    bad_file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in bad.items()))
    probes = serve_parser_probe(vllm, [*configs, bad_file])
    for target, (path, config) in configs.items():
        problems = check_parsed(config, probes[target])
        check(not problems, f"profile {path.name} (rendered by serve_config.build, role_args {extra}): "
              + (f"the real vllm serve parser gives all {len(config)} values as meant; argv after the config: "
                 f"{' '.join(probes[target]['argv'])}" if not problems else "; ".join(problems)))
    target, (path, config) = next(iter(configs.items()))
    wrong = {**config, "max-model-len": config.get("max-model-len", 0) + 1}
    problems = check_parsed(wrong, probes[target])
    check(bool(problems), f"negative control: {path.name} compared as if it meant max-model-len "
                          f"{wrong['max-model-len']}: {'; '.join(problems) or 'no difference reported'}")
    refused = probes[str(bad_file)]
    check(refused["status"] == 2 and f"--{NOT_A_FLAG[0]}" in refused["stderr"],
          f"negative control: {Path(bad_path).stem} plus {NOT_A_FLAG[0]}: {NOT_A_FLAG[1]}: the real parser exited "
          f"{refused['status']}: {refused['stderr'].strip().splitlines()[-1:] or '(nothing on stderr)'}")


# --------------------------------------------------------------------------- main

def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scratch", nargs="?", help="scratch directory (default: a new temporary one)")
    parser.add_argument("--standin-rev", help="the stand-in as committed at this revision (default: the working tree)")
    args = parser.parse_args(argv)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="vllm-fleet-check-real-")).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    scratch.chmod(0o755)  # the bench runs as nobody (the soak's run_as) and walks through it
    failures = []

    def check(ok: bool, line: str) -> None:
        print(("ok   " if ok else "FAIL ") + line, flush=True)
        if not ok:
            failures.append(line)

    # --- cuDNN and NVML
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

    # --- the real vLLM and its contract
    vllm, how = real_vllm_venv(scratch)
    versions = rig.package_versions(vllm, ("vllm", "torch", "transformers", "tokenizers"))
    check(versions["vllm"] == VLLM_VERSION, f"real vllm venv: {how}; {versions}")
    check(*check_contract(vllm, scratch))

    standin, which = rig.standin_venv(scratch, args.standin_rev)
    print(f"stand-in: {which}", flush=True)
    bench_checks(check, scratch, vllm, standin)
    profile_checks(check, scratch, vllm)

    print(f"check-real: {'FAILED' if failures else 'passed'} ({scratch})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
