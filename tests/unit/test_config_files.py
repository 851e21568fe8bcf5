"""config_files: a node's configuration in one module run (module_utils, without Ansible,
as the user running the tests; the module end to end through ansible localhost)."""
from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.config_files import ConfigFilesError, apply

ROOT = Path(__file__).resolve().parents[2]
ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def entry(path, mode="0640", **more) -> dict:
    return {"path": str(path), "owner": ME, "group": MY_GROUP, "mode": mode, **more}


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_writes_directories_and_files_then_changes_nothing_on_a_second_run(tmp_path):
    conf = tmp_path / "etc" / "vllm-fleet"
    dirs = [entry(conf, "0750")]
    files = [entry(conf / "gpu0.yaml", content="model: a\n"), entry(conf / "api-key.env", "0600", content="K=1\n")]
    assert apply(dirs, files) == [str(conf), str(conf / "gpu0.yaml"), str(conf / "api-key.env")]
    assert (conf / "gpu0.yaml").read_text() == "model: a\n"
    assert mode(conf) == 0o750 and mode(conf / "gpu0.yaml") == 0o640 and mode(conf / "api-key.env") == 0o600
    assert apply(dirs, files) == []
    assert not [p for p in conf.iterdir() if p.name.startswith(".vllm-fleet-")]  # no temporary file left


def test_only_what_differs_changes_content_or_mode(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    apply(files=[entry(a, content="1"), entry(b, content="2")])
    inode = os.stat(b).st_ino
    assert apply(files=[entry(a, content="changed"), entry(b, "0600", content="2")]) == [str(a), str(b)]
    assert a.read_text() == "changed" and mode(b) == 0o600
    assert os.stat(b).st_ino == inode  # a mode change does not rewrite the file


def test_copies_from_a_file_on_the_node_and_removes_absent_paths(tmp_path):
    (tmp_path / "gpu0.yaml").write_text("served\n")
    (tmp_path / "gpu1.yaml").write_text("stale\n")
    kept = tmp_path / "known-good"
    changed = apply([entry(kept, "0750")], [entry(kept / "gpu0.yaml", src=str(tmp_path / "gpu0.yaml"))],
                    absent=[str(tmp_path / "gpu1.yaml"), str(tmp_path / "never-there")])
    assert changed == [str(kept), str(kept / "gpu0.yaml"), str(tmp_path / "gpu1.yaml")]
    assert (kept / "gpu0.yaml").read_text() == "served\n" and not (tmp_path / "gpu1.yaml").exists()


def test_a_copy_of_a_missing_optional_file_removes_the_copy(tmp_path):
    """if_src_missing: remove. A known-good copy of an API key file that is no longer
    written, and a rollback of a configuration that had no key, both end with no file."""
    source, copy = tmp_path / "api-key.env", tmp_path / "known-good-api-key.env"
    optional = {**entry(copy, "0600", src=str(source)), "if_src_missing": "remove"}
    source.write_text("VLLM_API_KEY=x\n")
    assert apply(files=[optional]) == [str(copy)] and copy.read_text() == "VLLM_API_KEY=x\n"
    source.unlink()
    assert apply(files=[optional], check=True) == [str(copy)] and copy.exists()
    assert apply(files=[optional]) == [str(copy)] and not copy.exists()
    assert apply(files=[optional]) == []  # nothing to copy, nothing there: no change
    with pytest.raises(ConfigFilesError, match="does not exist on the node"):  # the default still fails
        apply(files=[entry(copy, src=str(source))])
    copy.write_text("kept\n")  # if_src_missing: keep leaves the file alone
    assert apply(files=[{**optional, "if_src_missing": "keep"}]) == [] and copy.read_text() == "kept\n"


def test_check_mode_reports_and_writes_nothing(tmp_path):
    target = tmp_path / "d" / "f"
    assert apply([entry(tmp_path / "d", "0750")], [entry(target, content="x")], check=True) == \
        [str(tmp_path / "d"), str(target)]
    assert not (tmp_path / "d").exists()


def test_check_mode_counts_a_user_not_yet_created_as_a_change_not_an_error(tmp_path):
    """In check mode the role's user task only reports that it would create the service user."""
    existing = tmp_path / "f"
    existing.write_text("x")
    later = {**entry(existing, content="x"), "owner": "no-such-user-here", "group": "no-such-group-here"}
    assert apply(files=[later], check=True) == [str(existing)]
    with pytest.raises(ConfigFilesError, match="owner 'no-such-user-here' is not a user"):
        apply(files=[later])


@pytest.mark.parametrize("bad, words", [
    ({"mode": "640x"}, "mode '640x' is not an octal mode"),
    ({"mode": 416}, "mode '416' is not an octal mode"),  # an unquoted YAML 0640
    ({"owner": "no-such-user-here"}, "owner 'no-such-user-here' is not a user on this node"),
    ({"group": "no-such-group-here"}, "group 'no-such-group-here' is not a group on this node"),
    ({"src": "/nonexistent/source"}, "its source /nonexistent/source does not exist on the node"),
])
def test_bad_input_is_named_and_changes_nothing(tmp_path, bad, words):
    first = tmp_path / "first"
    good = entry(first, content="untouched")
    broken = {**entry(tmp_path / "second", content=None if "src" in bad else "x"), **bad}
    with pytest.raises(ConfigFilesError, match=words.replace("(", r"\(")):
        apply(files=[good, broken])
    assert not first.exists()  # checked before the first write


def test_the_module_hides_file_content_and_reports_the_changed_paths(tmp_path):
    """Through Ansible: a secret given as content is in no output, only its path is."""
    target = tmp_path / "api-key.env"
    files = [{"path": str(target), "content": "VLLM_API_KEY=sk-very-secret-1", "owner": ME, "group": MY_GROUP,
              "mode": "0600"}]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "json"}
    args = json.dumps({"files": files})
    run = subprocess.run(["ansible", "localhost", "-c", "local", "-vvv", "-m", "vllm_fleet.fleet.config_files",
                          "-a", args], capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "sk-very-secret-1" not in run.stdout + run.stderr
    result = json.loads(run.stdout[run.stdout.index("{"):])["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["changed"] and result["changed_paths"] == [str(target)]
    assert target.read_text() == "VLLM_API_KEY=sk-very-secret-1" and mode(target) == 0o600
