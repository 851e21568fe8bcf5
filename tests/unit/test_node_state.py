"""node_state: one read of the node (GPU, cuDNN of current, links, recorded profiles)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.node_state import NodeStateError, read_node_state

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"
OLD = "vllm-0.25.1_nvidia-cudnn-cu13-9.19.0.56"
PROFILE = {"name": "nvfp4", "model": "m", "serve_args": {"kv-cache-dtype": "fp8"}, "env": {}}


def gpu():
    return {"available": True, "device_count": 1}


def cudnn_ok(venv, timeout, user=None):
    return {"venv": venv, "status": "ok", "timeout": timeout, "user": user}


def tree(tmp_path, current=None, known_good=None):
    root, config = tmp_path / "root", tmp_path / "etc"
    (root / "releases").mkdir(parents=True)
    (config / "known-good").mkdir(parents=True)
    for link, release in (("current", current), ("known-good", known_good)):
        if release:
            (root / "releases" / release).mkdir(exist_ok=True)
            (root / link).symlink_to(f"releases/{release}")
    return root, config


def test_a_node_that_serves_nothing_yet(tmp_path):
    root, config = tree(tmp_path)
    facts, state = read_node_state(str(root), str(config), gpu=gpu)  # the real cuDNN probe: no venv
    assert facts == gpu()
    assert state["cudnn_current"]["status"] == "no_venv"
    assert state["links"] == {"current": "", "known_good": ""}
    assert state["profile"] == {} and state["known_good_profile"] == {}
    assert state["soaks_left"] == []


def test_a_serving_node_reports_its_links_and_profiles(tmp_path):
    root, config = tree(tmp_path, current=RELEASE, known_good=OLD)
    (config / "profile.json").write_text(json.dumps(PROFILE))
    (config / "known-good" / "profile.json").write_text(json.dumps({**PROFILE, "name": "fp8"}))
    _, state = read_node_state(str(root), str(config), timeout=7, gpu=gpu, cudnn=cudnn_ok, user="nobody")
    # The release's Python runs as the user asked for (cudnn_facts switches to it).
    assert state["cudnn_current"] == {"venv": str(root / "current"), "status": "ok", "timeout": 7, "user": "nobody"}
    assert state["links"] == {"current": RELEASE, "known_good": OLD}
    assert state["profile"] == PROFILE
    assert state["known_good_profile"]["name"] == "fp8"


def test_without_the_cudnn_probe_the_venv_is_not_run(tmp_path):
    def refuse(venv, timeout, user=None):
        raise AssertionError(f"probed {venv}")

    root, config = tree(tmp_path, current=RELEASE, known_good=RELEASE)
    _, state = read_node_state(str(root), str(config), probe_cudnn=False, gpu=gpu, cudnn=refuse)
    assert state["cudnn_current"] is None and state["links"]["current"] == RELEASE


def test_a_directory_where_a_link_belongs_is_no_release(tmp_path):
    root, config = tree(tmp_path)
    (root / "known-good").mkdir()
    _, state = read_node_state(str(root), str(config), gpu=gpu, cudnn=cudnn_ok)
    assert state["links"]["known_good"] == ""


@pytest.mark.parametrize("content, why", [("{not json", "cannot be read"), ("[1, 2]", "holds list")])
def test_a_broken_recorded_profile_is_named(tmp_path, content, why):
    root, config = tree(tmp_path, current=RELEASE)
    (config / "profile.json").write_text(content)
    with pytest.raises(NodeStateError, match=f"{config / 'profile.json'} {why}"):
        read_node_state(str(root), str(config), gpu=gpu, cudnn=cudnn_ok)


def test_the_recorded_fingerprint_is_read_and_a_broken_one_named(tmp_path):
    root, config = tree(tmp_path, current=RELEASE, known_good=RELEASE)
    _, state = read_node_state(str(root), str(config), gpu=gpu, cudnn=cudnn_ok)
    assert state["known_good_fingerprint"] == {}  # none recorded yet
    (config / "known-good").mkdir(exist_ok=True)
    record = {"version": 1, "salt": "ab" * 16, "files": {"/etc/vllm-fleet/gpu0.yaml": "sha256:00"}}
    (config / "known-good" / "fingerprint.json").write_text(json.dumps(record))
    _, state = read_node_state(str(root), str(config), gpu=gpu, cudnn=cudnn_ok)
    assert state["known_good_fingerprint"] == record
    (config / "known-good" / "fingerprint.json").write_text("[]")
    with pytest.raises(NodeStateError, match="holds list, not a recorded configuration fingerprint"):
        read_node_state(str(root), str(config), gpu=gpu, cudnn=cudnn_ok)


def run_module(args: str):
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"}
    proc = subprocess.run(
        [Path(sys.executable).parent / "ansible", "localhost", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-m", "vllm_fleet.fleet.node_state", "-a", args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_module_sets_both_facts_in_one_run(tmp_path):
    root, config = tree(tmp_path)
    rc, result = run_module(f"root={root} config_dir={config}")
    assert rc == 0 and result["changed"] is False
    assert "available" in result["ansible_facts"]["vllm_fleet_gpu"]
    assert result["ansible_facts"]["vllm_fleet_node_state"]["cudnn_current"]["status"] == "no_venv"


def test_module_names_the_broken_file_and_a_bad_timeout(tmp_path):
    root, config = tree(tmp_path)
    (config / "known-good" / "profile.json").write_text("{")
    rc, result = run_module(f"root={root} config_dir={config}")
    assert rc != 0 and str(config / "known-good" / "profile.json") in result["msg"]
    rc, result = run_module(f"root={root} config_dir={config} timeout=0")
    assert rc != 0 and result["msg"] == "timeout must be a positive number of seconds, not 0"


def test_a_soak_an_interrupted_rollout_left_running_is_reported(tmp_path):
    """A run directory under current/soak whose progress names a live soak and has no verdict
    (soak_stop's orphans): the turn stops it only when the read reports one."""
    root, config = tree(tmp_path, current=RELEASE)
    state_dir = root / "releases" / RELEASE / "soak" / "20261204T120000Z-gpu0"
    state_dir.mkdir(parents=True)
    # Popen returns once exec began, before the kernel sets the new cmdline that _is_soak reads:
    # the child says when it runs.
    proc = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)",
                             "vllm_fleet.fleet.soak"], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        (state_dir / "progress.jsonl").write_text(json.dumps({"pid": proc.pid, "elapsed_s": 4.0}) + "\n")
        _, state = read_node_state(str(root), str(config), gpu=gpu, cudnn=cudnn_ok)
        assert state["soaks_left"] == [{"state_dir": str(root / "current" / "soak" / state_dir.name),
                                        "pid": proc.pid, "elapsed_s": 4.0}]
        (state_dir / "verdict.json").write_text('{"passed": true}\n')  # finished: nothing left
        assert read_node_state(str(root), str(config), gpu=gpu, cudnn=cudnn_ok)[1]["soaks_left"] == []
    finally:
        proc.kill()
        proc.wait()
