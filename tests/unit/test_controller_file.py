"""controller_file's plain-Python part: append, the atomic write, what changed. The action
plugin in a playbook: tests/unit/test_controller_actions.py."""

import json
import stat

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.controller_file import (
    ControllerFileError,
    merged,
    write,
)


def test_write_makes_the_directories_and_says_what_changed(tmp_path):
    path = tmp_path / "reports" / "rollout" / "node01.json"
    assert write(str(path), "{}\n", 0o640) is True
    assert path.read_text() == "{}\n" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o755 == 0o755
    assert write(str(path), "{}\n", 0o640) is False  # the same text: nothing to do
    assert write(str(path), "[]\n", 0o640, check=True) is True and path.read_text() == "{}\n"  # check mode
    assert [p.name for p in path.parent.iterdir()] == ["node01.json"]  # no temporary file left


def test_write_names_the_path_it_cannot_write(tmp_path):
    blocker = tmp_path / "reports"
    blocker.write_text("a file where the directory should be")
    with pytest.raises(ControllerFileError, match=f"{blocker}/x.json cannot be written"):
        write(str(blocker / "x.json"), "{}\n", 0o644)


def test_append_extends_the_list_already_there(tmp_path):
    path = tmp_path / "notifications.json"
    assert merged(str(path), [{"a": 1}], append=True) == [{"a": 1}]  # no file yet: an empty list
    path.write_text(json.dumps([{"a": 1}]))
    assert merged(str(path), [{"b": 2}], append=True) == [{"a": 1}, {"b": 2}]
    assert merged(str(path), {"c": 3}, append=False) == {"c": 3}
    with pytest.raises(ControllerFileError, match="append needs data to be a list, not dict"):
        merged(str(path), {"c": 3}, append=True)
    path.write_text("{}")
    with pytest.raises(ControllerFileError, match="holds a dict, not a list"):
        merged(str(path), [1], append=True)
    path.write_text("[")
    with pytest.raises(ControllerFileError, match="cannot be appended to"):
        merged(str(path), [1], append=True)
