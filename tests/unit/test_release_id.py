"""The release id: named from the pinned set, validated, and the filter that exposes it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import (
    ReleaseError,
    release_id,
    validate_release,
)

ROOT = Path(__file__).resolve().parents[2]
PLAN = {"vllm": "0.25.1", "torch": "2.11.0", "cudnn_package": "nvidia-cudnn-cu13", "cudnn": "9.24.0.43"}


def test_id_names_vllm_and_the_cudnn_override():
    assert release_id(PLAN) == "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"


def test_torch_is_not_part_of_the_id():
    # vLLM pins torch exactly: the same vLLM means the same torch.
    assert release_id({k: v for k, v in PLAN.items() if k != "torch"}) == release_id(PLAN)


@pytest.mark.parametrize("variant", [
    {"cudnn_package": "NVIDIA_cuDNN.cu13"},
    {"vllm": "0.25.01", "cudnn": " 9.24.0.43 "},
    {"vllm": "v0.25.1"},
])
def test_equivalent_spellings_give_one_id(variant):
    assert release_id({**PLAN, **variant}) == release_id(PLAN)


def test_the_id_splits_back_into_its_pins():
    vllm_part, cudnn_part = release_id(PLAN).split("_")
    assert vllm_part == "vllm-0.25.1"
    assert cudnn_part.rsplit("-", 1) == ["nvidia-cudnn-cu13", "9.24.0.43"]


def test_local_versions_stay_readable_and_safe():
    rid = release_id({**PLAN, "vllm": "0.25.1+cu130"})
    assert rid == "vllm-0.25.1+cu130_nvidia-cudnn-cu13-9.24.0.43"
    assert "/" not in rid and " " not in rid


def test_different_pins_give_different_ids():
    assert release_id({**PLAN, "cudnn": "9.19.0.56"}) != release_id(PLAN)
    assert release_id({**PLAN, "cudnn_package": "nvidia-cudnn-cu12"}) != release_id(PLAN)


@pytest.mark.parametrize("plan, words", [
    ({**PLAN, "cudnnn": "9.24"}, ["unknown key", "'cudnnn'"]),
    ({k: v for k, v in PLAN.items() if k != "cudnn"}, ["missing", "'cudnn'"]),
    ({**PLAN, "cudnn": ">=9.23.1"}, ["vllm_fleet_release.cudnn", ">=9.23.1", "not an exact version"]),
    ({**PLAN, "vllm": "latest"}, ["vllm_fleet_release.vllm", "'latest'"]),
    ({**PLAN, "vllm": True}, ["vllm_fleet_release.vllm", "True"]),
    ({**PLAN, "cudnn_package": "nvidia cudnn"}, ["vllm_fleet_release.cudnn_package", "'nvidia cudnn'"]),
    ({**PLAN, "cudnn_package": "../../etc"}, ["vllm_fleet_release.cudnn_package"]),
    ({**PLAN, "torch": "2.x"}, ["vllm_fleet_release.torch", "'2.x'"]),
    ({**PLAN, "vllm": "1!0.25.1"}, ["vllm_fleet_release.vllm", "epoch"]),
    (["vllm==0.25.1"], ["must be a mapping", "list"]),
])
def test_bad_plans_name_the_key_and_value(plan, words):
    with pytest.raises(ReleaseError) as err:
        release_id(plan)
    for word in words:
        assert word in str(err.value)


def test_validate_normalises():
    assert validate_release({**PLAN, "cudnn_package": "NVIDIA_cuDNN_cu13"})["cudnn_package"] == "nvidia-cudnn-cu13"


def _debug(expr: str, extra_vars: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-m", "ansible.builtin.debug", "-a", f"msg={{{{ {expr} }}}}", "-e", json.dumps(extra_vars)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_filter_through_ansible():
    """One Ansible run: the FQCN resolves, a good plan gives the id, a bad one the reason."""
    expr = ("[good | vllm_fleet.fleet.release_id, "
            "(bad | vllm_fleet.fleet.release_id) if false else 'unused']")
    ok = _debug(expr, {"good": PLAN, "bad": {}})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    result = json.loads(ok.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["msg"][0] == "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"

    bad = _debug("release | vllm_fleet.fleet.release_id", {"release": {**PLAN, "cudnnn": "9"}})
    assert bad.returncode != 0
    result = json.loads(bad.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert "unknown key 'cudnnn'" in result["msg"]
