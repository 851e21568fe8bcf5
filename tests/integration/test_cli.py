"""The vllm-fleet console script against simulated nodes: the real preflight playbook, the
real modules and NVML code path, driven through ansible-runner, from outside the checkout.
Every outcome is checked three ways: the exit code, the JSON summary, the JUnit XML."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.fixtures.simnode import simnode
from tests.integration.playbook import vllm_fleet

CUDNN_BLOCKER = "cudnn-sm12x-fusion-matmul-oob"
BAD_CUDNN = {"vllm": "0.25.1", "torch": "2.11.0", "cudnn_package": "nvidia-cudnn-cu13", "cudnn": "9.19.0.56"}
GOOD_CUDNN = {**BAD_CUDNN, "cudnn": "9.24.0.43"}


def junit_counts(root: ET.Element) -> tuple[int, int, int]:
    suite = root.find("testsuite")
    return int(suite.get("tests")), int(suite.get("failures")), int(suite.get("errors"))


def junit_case(root: ET.Element, name: str) -> ET.Element:
    return next(c for c in root.iter("testcase") if c.get("name") == name)


@pytest.fixture
def fleet(sim_nodes, tmp_path):
    nodes = sim_nodes({"sm120": "rtx_pro_6000", "sm100": "b200"})
    # An inventory entry whose container is gone: Ansible cannot reach it.
    ghost = simnode.Node(name="ghost", container=f"{nodes[0].container}-gone")
    inventory = simnode.write_inventory([*nodes, ghost], tmp_path / "inventory.yml",
                                        {"canary": ["sm120"], "fleet": ["sm100", "ghost"]})
    return inventory


def release(value: dict) -> str:
    return json.dumps({"vllm_fleet_release": value})


def test_clean_plan_exits_0(fleet, tmp_path):
    code, output, summary, junit = vllm_fleet(tmp_path, "preflight", "-i", str(fleet), "--limit", "sm120,sm100",
                                              "-e", release(GOOD_CUDNN))

    assert code == 0, output[-4000:]
    assert (summary["outcome"], summary["exit_code"], summary["rc"]) == ("success", 0, 0)
    assert (summary["command"], summary["playbook"], summary["limit"]) == \
        ("preflight", "playbooks/preflight.yml", "sm120,sm100")
    assert set(summary["hosts"]) == {"sm120", "sm100"}
    for name, info in summary["hosts"].items():
        assert info["status"] == "ok", (name, info)
        # vLLM 0.25.1's exit-0 warning is not accepted here: warn is still a success
        assert info["preflight_verdict"] == "warn"
        assert info["release"]["cudnn"] == "9.24.0.43"
        assert info["failed_task"] is None and info["soak_verdict"] is None
    assert "preflight.json" in summary["reports"]
    run = Path(summary["artifacts"])
    assert run == tmp_path / "run"
    assert json.loads((run / "reports" / "preflight.json").read_text())["sm120"]["report"]["verdict"] == "warn"
    assert (run / "artifacts" / "preflight" / "job_events").is_dir()
    assert junit_counts(junit) == (2, 0, 0)
    # progress: the play, and each node's summary as the roles print it
    assert "PLAY Preflight vLLM nodes against the known-issues catalogue" in output
    assert "sm120" in output and "Summarise the node | verdict: warn" in output
    assert "vllm-fleet preflight: success (exit 0)" in output


def test_cudnn_9_19_planned_on_an_rtx_pro_6000_exits_3(fleet, tmp_path):
    code, output, summary, junit = vllm_fleet(tmp_path, "preflight", "-i", str(fleet), "-l", "sm120,sm100",
                                              "-e", release(BAD_CUDNN))

    assert code == 3, output[-4000:]
    assert (summary["outcome"], summary["outcomes"], summary["exit_code"]) == \
        ("preflight_blocked", ["preflight_blocked"], 3)
    sm120, sm100 = summary["hosts"]["sm120"], summary["hosts"]["sm100"]
    assert (sm120["status"], sm120["preflight_verdict"]) == ("blocked", "block")
    assert f"[{CUDNN_BLOCKER}]" in sm120["message"] and "9.23.1" in sm120["message"]
    assert sm120["release"]["cudnn"] == "9.19.0.56"
    assert sm120["failed_task"].startswith("preflight : Fail a node whose plan hits an unaccepted blocker")
    assert sm100["status"] == "ok"  # sm_100 is not affected by the sm_120 cuDNN bug
    assert junit_counts(junit) == (2, 1, 0)
    failure = junit_case(junit, "sm120").find("failure")
    assert failure.get("type") == "blocked" and CUDNN_BLOCKER in failure.text
    assert junit_case(junit, "sm100").find("failure") is None
    # the operator sees the finding and its fix as the run goes
    assert f"BLOCKER {CUDNN_BLOCKER}" in output and "nvidia-cudnn-cu13>=9.23.1" in output


def test_a_host_that_cannot_be_reached_exits_5(fleet, tmp_path):
    code, output, summary, junit = vllm_fleet(tmp_path, "preflight", "-i", str(fleet), "--limit", "canary,ghost",
                                              "-e", release(GOOD_CUDNN))

    assert code == 5, output[-4000:]
    assert (summary["outcome"], summary["outcomes"], summary["exit_code"]) == ("unreachable", ["unreachable"], 5)
    assert summary["hosts"]["sm120"]["status"] == "ok"
    ghost = summary["hosts"]["ghost"]
    assert ghost["status"] == "unreachable"
    assert ghost["failed_task"] == "preflight : Read the node's GPU and what it serves"
    assert ghost["message"]
    assert junit_counts(junit) == (2, 0, 1)
    assert junit_case(junit, "ghost").find("error").get("type") == "unreachable"
    assert "ghost" in output and "UNREACHABLE" in output


def test_extra_vars_garbage_exits_2_before_anything_runs(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    sm120:\n")
    code, output, summary, junit = vllm_fleet(tmp_path, "preflight", "-i", str(inventory),
                                              "-e", '{"vllm_fleet_release": {"cudnn": ')

    assert code == 2
    assert "--extra-vars '{\"vllm_fleet_release\": {\"cudnn\": '" in output
    assert (summary["outcome"], summary["exit_code"], summary["hosts"]) == ("usage_error", 2, {})
    assert summary["artifacts"] is None and not (tmp_path / "run").exists()
    assert junit_counts(junit) == (1, 0, 1)
    assert junit.find(".//error").get("type") == "usage_error"
