"""cudnn_facts against real venvs built from the stand-in wheels.

Every venv is made with uv from tests/fixtures/wheels only (the machine's pip and uv
configuration is shut out), so the real resolvers meet torch's real pin shape and the
real probes load the fake libcudnn.so.9.
"""

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import (
    CudnnFactsError,
    VenvNotFoundError,
    absent_venv_facts,
    collect_cudnn_facts,
)
from tests.fixtures.wheels.build import build_fake_cudnn, build_wheelhouse

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MODULE_PATH = ROOT / "plugins" / "modules" / "cudnn_facts.py"


def isolated_env():
    """This machine's pip/uv settings add indexes and constraints: keep them out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def check(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=isolated_env(), timeout=120, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory):
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="session")
def make_venv(tmp_path_factory, wheelhouse):
    base = tmp_path_factory.mktemp("venvs")
    cache = tmp_path_factory.mktemp("uv-cache")

    def make(name, *requirements, overrides=(), no_deps=False):
        venv = base / name
        check([BIN / "uv", "venv", "--no-config", "--quiet", "--python", sys.executable, venv])
        install(venv, *requirements, overrides=overrides, no_deps=no_deps)
        return venv

    def install(venv, *requirements, overrides=(), no_deps=False):
        cmd = [BIN / "uv", "pip", "install", "--no-config", "--no-index", "--find-links", wheelhouse]
        # copy, not hardlink: some tests rewrite installed files
        cmd += ["--cache-dir", cache, "--link-mode", "copy", "--python", venv / "bin" / "python", *requirements]
        if overrides:
            override_file = venv / "overrides.txt"
            override_file.write_text("\n".join(overrides) + "\n")
            cmd += ["--override", override_file]
        if no_deps:
            cmd.append("--no-deps")
        check(cmd)

    make.install = install
    return make


@pytest.fixture(scope="session")
def resolved_venv(make_venv):
    return make_venv("resolved", "torch==2.11.0")


@pytest.fixture(scope="session")
def override_venv(make_venv):
    return make_venv("override", "torch==2.11.0", overrides=["nvidia-cudnn-cu13==9.24.0.43"])


@pytest.fixture(scope="session")
def cu12_venv(make_venv):
    return make_venv("cu12", "nvidia-cudnn-cu12==9.19.0.56")


@pytest.fixture(scope="session")
def broken_venv(make_venv, tmp_path_factory):
    """torch with its pinned cuDNN, whose library then aborts in cudnnGetVersion."""
    venv = make_venv("broken", "torch==2.11.0")
    lib = next(venv.glob("lib/python*/site-packages/nvidia/cudnn/lib/libcudnn.so.9"))
    aborting = build_fake_cudnn(tmp_path_factory.mktemp("abort") / "libcudnn.so.9", 91900, abort=True)
    os.replace(aborting, lib)
    return venv


# --- the stand-in wheels -------------------------------------------------------------


def wheel_files(wheelhouse, prefix):
    (path,) = wheelhouse.glob(f"{prefix}-py3-none-manylinux_2_17_x86_64.whl")
    with zipfile.ZipFile(path) as whl:
        return {name: whl.read(name) for name in whl.namelist()}


def test_wheelhouse_holds_the_pin_shape_of_the_real_wheels(wheelhouse):
    names = sorted(p.name for p in wheelhouse.glob("*.whl"))
    assert names == [
        "nvidia_cudnn_cu12-9.19.0.56-py3-none-manylinux_2_17_x86_64.whl",
        "nvidia_cudnn_cu13-9.19.0.56-py3-none-manylinux_2_17_x86_64.whl",
        "nvidia_cudnn_cu13-9.23.1.21-py3-none-manylinux_2_17_x86_64.whl",
        "nvidia_cudnn_cu13-9.24.0.43-py3-none-manylinux_2_17_x86_64.whl",
        "torch-2.11.0-py3-none-manylinux_2_17_x86_64.whl",
    ]
    metadata = wheel_files(wheelhouse, "torch-2.11.0")["torch-2.11.0.dist-info/METADATA"].decode()
    assert "Requires-Dist: nvidia-cudnn-cu13==9.19.0.56" in metadata.splitlines()


@pytest.mark.parametrize("prefix", ["nvidia_cudnn_cu13-9.24.0.43", "nvidia_cudnn_cu12-9.19.0.56"])
def test_cudnn_wheel_layout_and_record(wheelhouse, prefix):
    files = wheel_files(wheelhouse, prefix)
    # nvidia is a namespace package shared by all nvidia-* wheels: no nvidia/__init__.py
    assert "nvidia/__init__.py" not in files
    assert "nvidia/cudnn/lib/libcudnn.so.9" in files
    info = f"{prefix}.dist-info"
    rows = list(csv.reader(io.StringIO(files[f"{info}/RECORD"].decode())))
    assert {row[0] for row in rows} == set(files)
    for path, digest, size in rows:
        if path == f"{info}/RECORD":
            assert (digest, size) == ("", "")
            continue
        expected = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={expected}", len(files[path]))


def test_wheelhouse_is_idempotent_and_repairs_itself(tmp_path):
    out = build_wheelhouse(tmp_path / "wh")
    wheels = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.whl")}
    assert build_wheelhouse(out) == out
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.whl")} == {n: m for n, (m, _) in wheels.items()}

    torch = out / "torch-2.11.0-py3-none-manylinux_2_17_x86_64.whl"
    torch.unlink()
    build_wheelhouse(out)
    assert torch.read_bytes() == wheels[torch.name][1], "a rebuild must give the same bytes"


# --- resolving the override with the real tools --------------------------------------


def test_torch_resolved_normally_loads_its_pinned_cudnn(resolved_venv):
    facts = collect_cudnn_facts(str(resolved_venv))

    site = next(resolved_venv.glob("lib/python*/site-packages"))
    lib = str(site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9")
    assert facts["wheels"] == [{"name": "nvidia-cudnn-cu13", "version": "9.19.0.56", "library_path": lib}]
    assert facts["python"] == str(resolved_venv / "bin" / "python")
    assert (facts["library_path"], facts["library_version"], facts["library_version_raw"]) == (lib, "9.19.0", 91900)
    assert (facts["torch_version"], facts["torch_cudnn_version"], facts["torch_cudnn_version_raw"]) == (
        "2.11.0",
        "9.19.0",
        91900,
    )
    assert (facts["effective_version"], facts["effective_source"]) == ("9.19.0", "torch")
    assert facts["mismatch"] is False and facts["mismatch_detail"] is None
    assert facts["library_error"] is None and facts["torch_error"] is None
    assert facts["vllm_version"] is None
    assert facts["status"] == "ok"
    assert "9.19.0" in facts["message"] and "nvidia-cudnn-cu13 9.19.0.56" in facts["message"]


def test_uv_override_makes_torch_load_the_newer_cudnn(override_venv):
    facts = collect_cudnn_facts(str(override_venv))

    assert [(w["name"], w["version"]) for w in facts["wheels"]] == [("nvidia-cudnn-cu13", "9.24.0.43")]
    assert facts["torch_cudnn_version_raw"] == 92400
    assert facts["torch_cudnn_version"] == facts["library_version"] == facts["effective_version"] == "9.24.0"
    assert (facts["status"], facts["mismatch"]) == ("ok", False)


def test_pip_refuses_torch_with_the_newer_cudnn_pin(wheelhouse):
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-index",
        "--find-links",
        wheelhouse,
    ]
    env = isolated_env()
    alone = subprocess.run([*pip, "torch==2.11.0"], capture_output=True, text=True, env=env, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert "Would install nvidia-cudnn-cu13-9.19.0.56 torch-2.11.0" in alone.stdout

    both = subprocess.run(
        [*pip, "torch==2.11.0", "nvidia-cudnn-cu13==9.24.0.43"], capture_output=True, text=True, env=env, timeout=120
    )
    assert both.returncode != 0
    assert "ResolutionImpossible" in both.stderr
    assert "torch 2.11.0 depends on nvidia-cudnn-cu13==9.19.0.56" in both.stdout + both.stderr


# --- venvs that are not the happy path -----------------------------------------------


def test_cudnn_without_torch(cu12_venv):
    facts = collect_cudnn_facts(str(cu12_venv))

    assert [(w["name"], w["version"]) for w in facts["wheels"]] == [("nvidia-cudnn-cu12", "9.19.0.56")]
    assert (facts["library_version"], facts["library_version_raw"]) == ("9.19.0", 91900)
    assert facts["torch_version"] is None and facts["torch_error"] is None
    assert (facts["effective_version"], facts["effective_source"]) == ("9.19.0", "library")
    assert (facts["status"], facts["mismatch"]) == ("no_torch", False)
    assert "torch is not installed" in facts["message"]


def test_torch_without_a_cudnn_wheel(make_venv):
    venv = make_venv("torch-only", "torch==2.11.0", no_deps=True)
    facts = collect_cudnn_facts(str(venv))

    assert facts["wheels"] == [] and facts["library_path"] is None and facts["library_version"] is None
    assert facts["torch_version"] == "2.11.0"
    assert facts["torch_cudnn_version"] is None
    # like the real torch, the stand-in cannot even import without its libcudnn
    assert "exit status 1" in facts["torch_error"] and "libcudnn.so" in facts["torch_error"]
    assert (facts["effective_version"], facts["effective_source"]) == (None, None)
    assert (facts["status"], facts["mismatch"]) == ("no_cudnn", False)
    assert "nvidia-cudnn-cu13" in facts["message"]


def test_aborting_library_is_reported_not_fatal(broken_venv):
    facts = collect_cudnn_facts(str(broken_venv))

    assert facts["library_version"] is None and "SIGABRT" in facts["library_error"]
    assert facts["torch_cudnn_version"] is None and "SIGABRT" in facts["torch_error"]
    assert (facts["effective_version"], facts["effective_source"]) == ("9.19.0", "wheel")
    assert facts["status"] == "no_torch"
    assert "SIGABRT" in facts["message"]


def test_cu12_wheel_overwriting_the_cu13_override_is_a_mismatch(make_venv):
    venv = make_venv("mixed", "torch==2.11.0", overrides=["nvidia-cudnn-cu13==9.24.0.43"])
    make_venv.install(venv, "nvidia-cudnn-cu12==9.19.0.56")  # same nvidia/cudnn/lib/libcudnn.so.9
    facts = collect_cudnn_facts(str(venv))

    assert [(w["name"], w["version"]) for w in facts["wheels"]] == [
        ("nvidia-cudnn-cu13", "9.24.0.43"),
        ("nvidia-cudnn-cu12", "9.19.0.56"),
    ]
    assert facts["library_version"] == facts["torch_cudnn_version"] == facts["effective_version"] == "9.19.0"
    assert (facts["status"], facts["mismatch"]) == ("mismatch", True)
    assert facts["mismatch_detail"] == (
        "cuDNN versions disagree: the nvidia-cudnn-cu13 wheel is 9.24.0.43, the nvidia-cudnn-cu12 wheel is "
        "9.19.0.56, libcudnn.so.9 reports 9.19.0, torch 2.11.0 loads cuDNN 9.19.0."
    )


def test_cu13_override_installed_after_cu12_is_still_a_mismatch(make_venv):
    # The other install order: the library and torch now agree with the cu13 wheel, but
    # the cu12 wheel's metadata still says 9.19.0.56 over the same nvidia/cudnn/lib.
    venv = make_venv("mixed-cu12-first", "nvidia-cudnn-cu12==9.19.0.56")
    make_venv.install(venv, "torch==2.11.0", overrides=["nvidia-cudnn-cu13==9.24.0.43"])
    facts = collect_cudnn_facts(str(venv))

    assert facts["library_version"] == facts["torch_cudnn_version"] == "9.24.0"
    assert (facts["status"], facts["mismatch"]) == ("mismatch", True)
    assert facts["mismatch_detail"] == (
        "cuDNN versions disagree: the nvidia-cudnn-cu13 wheel is 9.24.0.43, the nvidia-cudnn-cu12 wheel is "
        "9.19.0.56, libcudnn.so.9 reports 9.24.0, torch 2.11.0 loads cuDNN 9.24.0."
    )


def test_missing_venv_raises_with_the_path(tmp_path):
    missing = tmp_path / "releases" / "r1"
    with pytest.raises(VenvNotFoundError, match=f"venv {missing} does not exist"):
        collect_cudnn_facts(str(missing))
    assert issubclass(VenvNotFoundError, CudnnFactsError)


def test_directory_that_is_not_a_venv(tmp_path):
    with pytest.raises(CudnnFactsError, match=f"{tmp_path} is not a venv: it has no pyvenv.cfg") as raised:
        collect_cudnn_facts(str(tmp_path))
    assert not isinstance(raised.value, VenvNotFoundError)


def test_venv_whose_python_is_gone(tmp_path):
    (tmp_path / "pyvenv.cfg").write_text("home = /nonexistent\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to("/nonexistent/python3")
    with pytest.raises(CudnnFactsError, match=f"{tmp_path / 'bin' / 'python'} is missing or not executable"):
        collect_cudnn_facts(str(tmp_path))


def test_absent_venv_facts_have_the_contract_keys(resolved_venv, tmp_path):
    absent = absent_venv_facts(str(tmp_path / "nope"))
    assert absent.keys() == collect_cudnn_facts(str(resolved_venv)).keys()
    assert (absent["status"], absent["python"], absent["wheels"], absent["mismatch"]) == ("no_venv", None, [], False)
    assert str(tmp_path / "nope") in absent["message"]


# --- probe failures the real venvs do not show, through an injected run() -------------


@pytest.fixture
def fake_venv(tmp_path):
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 99\n")
    python.chmod(0o755)
    return tmp_path


class FakeRun:
    """Answers each probe by what it asks: listing, library, torch."""

    def __init__(self, listing, library=(0, "92400"), torch=(0, "92400")):
        self.answers = {"importlib.metadata": listing, "ctypes.CDLL": library, "import json, torch": torch}
        self.calls = []

    def __call__(self, cmd, **kwargs):
        self.calls.append((cmd, kwargs))
        answer = next(a for marker, a in self.answers.items() if marker in cmd[3])
        if isinstance(answer, BaseException):
            raise answer
        returncode, out = answer
        stdout, stderr = (out, "") if returncode == 0 else ("", out)
        return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)


LISTING = json.dumps(
    {
        "nvidia-cudnn-cu13": {"version": "9.24.0.43", "library_path": "/x/libcudnn.so.9"},
        "torch": {"version": "2.11.0"},
        "vllm": {"version": "0.25.1"},
    }
)


def test_probes_run_the_venv_python_isolated_with_the_timeout(fake_venv):
    run = FakeRun((0, LISTING))
    facts = collect_cudnn_facts(str(fake_venv), timeout=7, run=run)

    assert len(run.calls) == 3
    for cmd, kwargs in run.calls:
        assert cmd[:3] == [str(fake_venv / "bin" / "python"), "-I", "-c"]
        assert kwargs["timeout"] == 7
    assert run.calls[1][0][4:] == ["/x/libcudnn.so.9"]
    assert (facts["vllm_version"], facts["status"]) == ("0.25.1", "ok")


def test_torch_loading_an_older_cudnn_than_the_wheel(fake_venv):
    facts = collect_cudnn_facts(
        str(fake_venv), run=FakeRun((0, LISTING), library=(-signal.SIGSEGV, ""), torch=(0, "91900"))
    )

    assert facts["library_error"] == "loading /x/libcudnn.so.9 was killed by SIGSEGV: no output"
    assert facts["mismatch"] is True and facts["status"] == "mismatch"
    assert facts["mismatch_detail"] == (
        "cuDNN versions disagree: the nvidia-cudnn-cu13 wheel is 9.24.0.43, torch 2.11.0 loads cuDNN 9.19.0."
    )
    assert facts["effective_version"] == "9.19.0"


def test_two_wheels_at_the_same_release_agree(fake_venv):
    # Negative control for the every-wheel comparison: cu12 and cu13 of one release are no mismatch.
    listing = json.loads(LISTING)
    listing["nvidia-cudnn-cu12"] = {"version": "9.24.0.43", "library_path": "/x/libcudnn.so.9"}
    facts = collect_cudnn_facts(str(fake_venv), run=FakeRun((0, json.dumps(listing))))

    assert [w["name"] for w in facts["wheels"]] == ["nvidia-cudnn-cu13", "nvidia-cudnn-cu12"]
    assert (facts["status"], facts["mismatch"], facts["mismatch_detail"]) == ("ok", False, None)


def test_two_wheels_that_disagree_are_a_mismatch_whatever_the_library_says(fake_venv):
    listing = json.loads(LISTING)
    listing["nvidia-cudnn-cu12"] = {"version": "9.19.0.56", "library_path": "/x/libcudnn.so.9"}
    facts = collect_cudnn_facts(str(fake_venv), run=FakeRun((0, json.dumps(listing))))

    assert (facts["status"], facts["mismatch"], facts["effective_version"]) == ("mismatch", True, "9.24.0")
    assert "the nvidia-cudnn-cu12 wheel is 9.19.0.56" in facts["mismatch_detail"]


def test_hung_torch_probe_times_out(fake_venv):
    hung = subprocess.TimeoutExpired(["python"], 5)
    facts = collect_cudnn_facts(str(fake_venv), timeout=5, run=FakeRun((0, LISTING), torch=hung))

    assert facts["torch_error"] == "torch.backends.cudnn.version() timed out after 5s"
    assert (facts["effective_version"], facts["effective_source"], facts["status"]) == ("9.24.0", "library", "no_torch")


def test_torch_without_cudnn_support(fake_venv):
    facts = collect_cudnn_facts(str(fake_venv), run=FakeRun((0, LISTING), torch=(0, "null")))
    assert "returned None" in facts["torch_error"]
    assert facts["status"] == "no_torch"


def test_listing_failure_is_an_error_naming_venv_and_cause(fake_venv):
    traceback = "Traceback (most recent call last):\n  ...\nSyntaxError: invalid syntax\n"
    with pytest.raises(
        CudnnFactsError, match=rf"cannot list the packages of venv {fake_venv} .*SyntaxError: invalid syntax"
    ):
        collect_cudnn_facts(str(fake_venv), run=FakeRun((1, traceback)))


def test_real_python_that_cannot_run_the_probe(fake_venv):
    with pytest.raises(CudnnFactsError, match=r"exit status 99"):
        collect_cudnn_facts(str(fake_venv))


# --- the Ansible module ---------------------------------------------------------------


def load_module():
    spec = importlib.util.spec_from_file_location("cudnn_facts_module", MODULE_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_module_documents_its_arguments_and_every_result_key(tmp_path):
    module = load_module()
    options = yaml.safe_load(module.DOCUMENTATION)["options"]
    assert {name: (o["type"], o.get("default"), o.get("required", False)) for name, o in options.items()} == {
        name: (spec["type"], spec.get("default"), spec.get("required", False))
        for name, spec in module.ARGUMENT_SPEC.items()
    }
    returned = yaml.safe_load(module.RETURN)["cudnn"]["contains"]
    assert returned.keys() == absent_venv_facts(str(tmp_path)).keys()


def ansible_adhoc(args, python=sys.executable):
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"}
    cmd = [
        BIN / "ansible",
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={python}",
    ]
    proc = subprocess.run(
        [*cmd, "-m", "vllm_fleet.fleet.cudnn_facts", "-a", args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return proc.returncode, result


def test_module_end_to_end(override_venv):
    rc, result = ansible_adhoc(f"venv={override_venv}")
    assert rc == 0, result
    assert result["changed"] is False
    assert (result["cudnn"]["status"], result["cudnn"]["torch_cudnn_version"]) == ("ok", "9.24.0")


def test_module_survives_an_aborting_library(broken_venv):
    rc, result = ansible_adhoc(f"venv={broken_venv} timeout=30")
    assert rc == 0, result
    assert "SIGABRT" in result["cudnn"]["library_error"]


def test_module_fails_clearly_for_a_missing_venv(tmp_path):
    rc, result = ansible_adhoc(f"venv={tmp_path}/missing")
    assert rc != 0 and result["failed"] is True
    assert result["msg"].startswith(f"venv {tmp_path}/missing does not exist: ")
    assert "missing_ok" in result["msg"]


def test_module_missing_ok(tmp_path):
    rc, result = ansible_adhoc(f"venv={tmp_path}/missing missing_ok=true")
    assert rc == 0, result
    assert (result["cudnn"]["status"], result["cudnn"]["venv"]) == ("no_venv", f"{tmp_path}/missing")


def test_module_names_packaging_when_the_interpreter_lacks_it(cu12_venv):
    # a bare uv venv has no packaging: run the module itself with its Python
    rc, result = ansible_adhoc(f"venv={cu12_venv}", python=cu12_venv / "bin" / "python")
    assert rc != 0
    assert "Failed to import the required Python library (packaging)" in result["msg"]


def test_a_venv_at_a_long_path_is_listed_whole(make_venv):
    # The listing is one JSON line holding every library path: past 400 characters it was once
    # cut like an error message and read as garbage.
    venv = make_venv("long/" + "x" * 200 + "/" + "y" * 200, "torch==2.11.0",
                     overrides=["nvidia-cudnn-cu13==9.24.0.43"])
    facts = collect_cudnn_facts(str(venv))

    assert len(str(venv)) > 400
    assert (facts["status"], facts["effective_version"]) == ("ok", "9.24.0")
    assert facts["library_path"].startswith(str(venv))
