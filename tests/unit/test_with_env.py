"""roles/vllm_runtime/files/vllm-fleet-with-env: pip and uv get vllm_fleet_runtime_environment
from a root-only file instead of the remote shell's command line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HELPER = Path(__file__).resolve().parents[2] / "roles" / "vllm_runtime" / "files" / "vllm-fleet-with-env"
SHOW = [sys.executable, "-c", "import os, sys; print(os.environ.get(sys.argv[1], '<unset>'))"]


def run(env_file: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(HELPER), str(env_file), *command],
                          capture_output=True, text=True, timeout=30)


def test_the_file_s_values_reach_the_command_as_data(tmp_path):
    env_file = tmp_path / "environment.json"
    tricky = "http://u:p@proxy:3128/$HOME`id`;x"
    env_file.write_text(json.dumps({"HTTPS_PROXY": tricky, "UV_CONCURRENT_DOWNLOADS": 4}))
    assert run(env_file, *SHOW, "HTTPS_PROXY").stdout.strip() == tricky  # nothing expanded
    assert run(env_file, *SHOW, "UV_CONCURRENT_DOWNLOADS").stdout.strip() == "4"
    assert run(env_file, *SHOW, "PATH").stdout.strip() != "<unset>"  # added to the command's own


def test_an_empty_environment_changes_nothing_and_the_exit_status_is_the_command_s(tmp_path):
    env_file = tmp_path / "environment.json"
    env_file.write_text("{}")
    assert run(env_file, sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def test_bad_files_and_commands_are_named(tmp_path):
    missing = run(tmp_path / "nope.json", "true")
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"X": {"a": 1}}))
    assert run(nested, "true").returncode == 2
    ok = tmp_path / "ok.json"
    ok.write_text("{}")
    absent = run(ok, "/nonexistent/uv")
    assert absent.returncode == 127 and "cannot run /nonexistent/uv" in absent.stderr
