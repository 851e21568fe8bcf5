"""The release_prune module end to end through Ansible, on a directory of this machine."""
import json
import os
import subprocess
import sys
from pathlib import Path

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import MANIFEST_NAME

ROOT = Path(__file__).resolve().parents[2]


def prune(root: Path, *extra: str, args: str = "") -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-e", f"ansible_python_interpreter={sys.executable}",
           "-m", "vllm_fleet.fleet.release_prune", "-a", f"root={root} {args}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_module_prunes_and_supports_check_mode(tmp_path):
    releases = tmp_path / "releases"
    for i, name in enumerate(["old", "mid", "new"]):
        (releases / name).mkdir(parents=True)
        (releases / name / MANIFEST_NAME).write_text("{}")
        os.utime(releases / name / MANIFEST_NAME, (1000 + i, 1000 + i))
    (tmp_path / "current").symlink_to("releases/old")

    checked = prune(tmp_path, "--check", args="keep=2")
    assert checked["changed"] and checked["prune"]["removed"] == ["mid"]
    assert sorted(os.listdir(releases)) == ["mid", "new", "old"]

    done = prune(tmp_path, args="keep=2")
    assert done["changed"] and done["prune"]["removed"] == ["mid"]
    assert [k["name"] for k in done["prune"]["kept"]] == ["new", "old"]
    assert sorted(os.listdir(releases)) == ["new", "old"]
    assert done["msg"] == done["prune"]["message"]

    assert not prune(tmp_path, args="keep=2")["changed"]


def test_module_fails_on_a_bad_keep(tmp_path):
    result = prune(tmp_path, args="keep=-1")
    assert result["failed"] and "keep must be a whole number" in result["msg"]
