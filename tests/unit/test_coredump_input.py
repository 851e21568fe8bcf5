"""Hostile input to the core-dump path (issue 32): a text file dropped as a dump, cuda-gdb
parsing a file the serving user wrote on the controller, and a drop directory nested 1,200
levels deep.

The dumps here are the stand-in vLLM's (tests/fixtures/vllm_standin/src/vllm/coredump.py:
a real dump's ELF header, then a JSON record); the text file is the composed cuda-gdb output
tests/fixtures/coredumps/sm120_cudnn_matmul_oob.txt."""
from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.coredump import (
    SANDBOX_MEMORY,
    SANDBOX_OUTPUT,
    core_header_problem,
    run_sandboxed,
)

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SAVED_OUTPUT = ROOT / "tests" / "fixtures" / "coredumps" / "sm120_cudnn_matmul_oob.txt"
CUDA_GDB = ROOT / "tests" / "fixtures" / "cuda_gdb" / "cuda-gdb"
MOVER = ROOT / "roles" / "coredump" / "files" / "coredump-move"
COLLECT = ROOT / "roles" / "coredump" / "tasks" / "collect.yml"


def standin_header() -> bytes:
    spec = importlib.util.spec_from_file_location(
        "standin_coredump", ROOT / "tests" / "fixtures" / "vllm_standin" / "src" / "vllm" / "coredump.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.elf_header()


def header(**fields) -> bytes:
    """An ELF64 header with a GPU core dump's fields, but those given."""
    f = {"klass": 2, "data": 1, "ident_version": 1, "osabi": 0x33, "type": 4, "machine": 0xBE, "version": 1,
         "ehsize": 64, **fields}
    return (b"\x7fELF" + bytes([f["klass"], f["data"], f["ident_version"], f["osabi"], 0]) + bytes(7)
            + struct.pack("<HHIQQQIHHHHHH", f["type"], f["machine"], f["version"], 0, 0, 0, 0, f["ehsize"],
                          0, 0, 0, 0, 0))


# ------------------------------------------------------------------ the header a dump has

def test_the_standin_dump_and_a_real_dumps_fields_pass():  # negative control of the refusals below
    assert core_header_problem(standin_header()) is None
    assert core_header_problem(header() + b"rest of the dump") is None


@pytest.mark.parametrize("head, said", [
    (SAVED_OUTPUT.read_bytes()[:64], "not an ELF file"),
    (b"\x7fELF\x02\x01\x01\x33", "8 bytes, shorter than the 64-byte ELF64 header"),
    (header(osabi=0, machine=0x3E), "OS/ABI 0x0 (a dump has 0x33), machine 0x3e (a dump has 0xbe)"),  # a CPU core
    (header(type=2), "type 0x2 (a dump has 0x4)"),  # a cubin: ET_EXEC
    (header(klass=1), "class 0x1 (a dump has 0x2)"),
    (header(data=2), "data encoding 0x2 (a dump has 0x1)"),
    (header(ehsize=52), "header size 0x34 (a dump has 0x40)"),
], ids=["text", "short", "cpu-core", "cubin", "elf32", "big-endian", "header-size"])
def test_a_file_without_a_dumps_header_is_refused_naming_what_differs(head, said):
    problem = core_header_problem(head)
    assert problem is not None and said in problem, problem


def test_collect_triages_only_dumps_never_a_text_file_read_as_saved_output():
    # Reproduction: collect triaged the store's files with format auto, so a text file the
    # serving user dropped as core.1 was read as a saved cuda-gdb output (the cuDNN kernel).
    tasks = yaml.safe_load(COLLECT.read_text())
    [triage] = [t for t in tasks if "vllm_fleet.fleet.coredump_triage" in t]
    assert triage["vllm_fleet.fleet.coredump_triage"]["format"] == "cudacore"


PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Triage
      vllm_fleet.fleet.coredump_triage:
        path: "{{ item }}"
        format: cudacore
        cuda_gdb: "{{ cuda_gdb }}"
        catalogue: "{{ lookup('ansible.builtin.file', catalogue_path) | from_yaml }}"
      loop: "{{ paths }}"
      register: triaged
      ignore_errors: true

    - name: Save the results
      ansible.builtin.copy:
        content: "{{ triaged.results | to_json }}"
        dest: "{{ results_path }}"
        mode: "0600"
"""


def test_a_text_file_dropped_as_a_dump_is_refused_before_cuda_gdb_runs(tmp_path):
    dropped = tmp_path / "core_gpu-node-01.4242.1767104122.nvcudmp"
    shutil.copy(SAVED_OUTPUT, dropped)  # says: the cuDNN kernel, a known issue
    marker = tmp_path / "cuda-gdb-ran"
    spy = tmp_path / "cuda-gdb"  # records that it ran, then does what the stand-in does
    spy.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} {CUDA_GDB} \"$@\"\n")
    spy.chmod(0o755)
    dump = tmp_path / "core_gpu-node-01.4243.1767104123.nvcudmp"
    dump.write_bytes(standin_header() + b"not the stand-in's record")
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
         "-e", json.dumps({"ansible_python_interpreter": sys.executable, "paths": [str(dropped), str(dump)],
                           "cuda_gdb": str(spy), "catalogue_path": str(ROOT / "catalogue" / "known_issues.yml"),
                           "results_path": str(results)})],
        cwd=ROOT, env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp")),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text_result, dump_result = json.loads(results.read_text())
    assert text_result["failed"] and "coredump" not in text_result
    assert text_result["msg"] == (
        f"coredump_triage: {dropped} is not a CUDA GPU core dump (not an ELF file (a GPU core dump begins with "
        "\\x7fELF)): cuda-gdb was not run on it. GPU core dumps are the ELF files the CUDA driver writes where "
        "CUDA_COREDUMP_FILE says; a saved cuda-gdb output needs format cuda_gdb_output")
    # The file with a dump's header does reach cuda-gdb (which finds no record in it).
    assert marker.exists() and dump_result["failed"] and "could not be triaged" in dump_result["msg"]


# ------------------------------------------------------------------ cuda-gdb in a sandbox

PROBE = """#!{python}
import json, os, resource, subprocess, sys, time
mode = sys.argv[-1]
if mode == "report":
    limits = {{name: resource.getrlimit(getattr(resource, name))
              for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE")}}
    print(json.dumps({{"env": dict(os.environ), "cwd": os.getcwd(), "uid": os.getuid(), "limits": limits,
                      "umask": os.umask(0), "sid_is_own": os.getsid(0) == os.getpid(),
                      "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))}}))
elif mode == "flood":
    chunk = b"x" * (1 << 20)
    while True:
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
elif mode == "hang":
    child = subprocess.Popen(["sleep", "300"])
    open(os.environ["HOME"] + "/../grandchild-" + os.path.basename(os.environ["HOME"]), "w").write(str(child.pid))
    time.sleep(300)
"""


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / "bin" / "cuda-gdb"
    path.parent.mkdir()
    path.write_text(PROBE.format(python=sys.executable))
    path.chmod(0o755)
    return path


@pytest.fixture
def dump(tmp_path):
    path = tmp_path / "core.nvcudmp"
    path.write_bytes(header() + bytes(4096))
    path.chmod(0o600)
    return path


def report(probe, dump, timeout=60):
    rc, output = run_sandboxed([str(probe), "-nx", "-batch", "-ex", f"target cudacore {dump}", "report"],
                               str(dump), timeout)
    assert rc == 0, output
    return json.loads(output)


SECRETS = {"SSH_AUTH_SOCK": "/tmp/ssh-agent.sock", "ANSIBLE_VAULT_PASSWORD_FILE": "/root/.vault-pass",
           "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI", "VLLM_FLEET_API_KEY": "sk-live-5f3c9a0e"}


def test_cuda_gdb_gets_a_private_environment_and_none_of_the_controllers_secrets(probe, dump, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    seen = report(probe, dump)
    assert set(seen["env"]) <= {"PATH", "HOME", "TMPDIR", "LC_ALL", "LANG"}, seen["env"]
    assert seen["env"]["PATH"].split(os.pathsep)[0] == str(probe.parent)
    assert seen["cwd"] == seen["env"]["HOME"] and Path(seen["cwd"]).name.startswith("coredump-triage-")
    assert not Path(seen["cwd"]).exists()  # removed afterwards
    assert seen["umask"] == 0o077 and seen["sid_is_own"]
    assert seen["fds"] == [0, 1, 2, 3]  # stdio and the listing's own: nothing inherited


def test_without_the_sandbox_the_secrets_would_reach_cuda_gdb(probe, dump, monkeypatch):  # negative control
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    # How the module ran cuda-gdb before: subprocess.run with the controller's environment.
    proc = subprocess.run([str(probe), "report"], capture_output=True, check=True)
    assert set(SECRETS) <= set(json.loads(proc.stdout)["env"])


def test_cuda_gdb_runs_under_cpu_memory_file_and_core_limits(probe, dump):
    limits = report(probe, dump, timeout=45)["limits"]
    assert limits["RLIMIT_CPU"] == [45, 45]
    assert limits["RLIMIT_AS"][0] <= SANDBOX_MEMORY + 2 * dump.stat().st_size
    assert limits["RLIMIT_FSIZE"][0] <= SANDBOX_OUTPUT and limits["RLIMIT_CORE"] == [0, 0]
    assert limits["RLIMIT_NOFILE"][0] <= 256
    assert resource.getrlimit(resource.RLIMIT_CPU)[0] != 45  # the module's own process is untouched


def test_an_endless_output_is_cut_at_the_cap(probe, dump):
    rc, output = run_sandboxed([str(probe), "flood"], str(dump), 60)
    assert rc != 0 and len(output) <= SANDBOX_OUTPUT


def test_a_timeout_kills_the_whole_process_group(probe, dump, tmp_path):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_sandboxed([str(probe), "hang"], str(dump), 2)
    assert time.monotonic() - started < 30
    [pid_file] = list(Path(tempfile.gettempdir()).glob("grandchild-coredump-triage-*"))  # beside its home
    pid = int(pid_file.read_text())
    pid_file.unlink()
    for _ in range(50):  # killed, then reaped by init
        if not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild {pid} still runs")


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
                    reason="dropping to the dump's owner needs root (and a python3 that user may run)")
def test_as_root_cuda_gdb_runs_as_the_dumps_owner():
    # Where the dump's owner can reach (pytest's tmp_path is root-only).
    place = Path(tempfile.mkdtemp(prefix="coredump-owner-", dir="/tmp"))
    try:
        place.chmod(0o755)
        probe = place / "cuda-gdb"
        probe.write_text(PROBE.format(python="/usr/bin/python3"))
        probe.chmod(0o755)
        dump = place / "core.nvcudmp"
        dump.write_bytes(header())
        dump.chmod(0o600)
        os.chown(dump, 65534, 65534)
        assert report(probe, dump)["uid"] == 65534
        os.chown(dump, 0, 0)
        assert report(probe, dump)["uid"] == 0  # a root-owned dump: no other user could read it
    finally:
        shutil.rmtree(place)


# ------------------------------------------------------------------ the node's mover

def run_mover(drop: Path, store: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(MOVER), str(drop), str(store)], capture_output=True, text=True,
                          check=False, timeout=120)


def test_a_drop_directory_1200_levels_deep_is_cut_down_and_later_dumps_still_move(tmp_path):
    # Reproduction: RecursionError in coredump-move, and the dumps after it stayed in the drop.
    drop, store = tmp_path / "drop", tmp_path / "store"
    drop.mkdir()
    store.mkdir()
    deep = os.open(drop, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir("a-deep", dir_fd=deep)
    for _ in range(1200):  # relative to each level's fd: the path is too long to name
        level = os.open("a-deep" if _ == 0 else "d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=deep)
        os.close(deep)
        deep = level
        os.mkdir("d", dir_fd=deep)
    os.close(deep)
    (drop / "core.z").write_bytes(b"dump")
    try:
        proc = run_mover(drop, store)
        if os.geteuid() != 0:
            pytest.skip("the mover chowns to root")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert sorted(p.name for p in drop.iterdir()) == []
        assert (store / "core.z").read_bytes() == b"dump"
        assert f"refused a-deep: not a regular file; deleted down to 64 levels, 1 directory(ies) deeper left in " \
               f"{store / 'a-deep'}" in proc.stdout
        assert proc.stdout.rstrip().endswith(f"1 dump(s) moved into {store}")
    finally:  # rm walks without recursion; pytest's own clean-up (shutil.rmtree) would not get through
        subprocess.run(["rm", "-rf", str(drop), str(store)], check=True)


def test_a_shallow_directory_is_deleted_whole(tmp_path):  # negative control of the depth limit
    drop, store = tmp_path / "drop", tmp_path / "store"
    (drop / "x" / "y" / "z").mkdir(parents=True)
    (drop / "x" / "y" / "z" / "f").write_text("")
    (drop / "x" / "link").symlink_to("/etc")  # not followed
    store.mkdir()
    proc = run_mover(drop, store)
    if os.geteuid() != 0:
        pytest.skip("the mover chowns to root")
    assert "refused x: not a regular file; deleted\n" in proc.stdout
    assert list(store.iterdir()) == [] and Path("/etc/passwd").exists()
