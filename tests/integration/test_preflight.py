"""preflight.yml against simulated nodes: the real modules, the real NVML code path,
the real cuDNN probes in a venv on the node."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.fixtures.simnode import simnode
from tests.integration.playbook import ansible_playbook

CUDNN_BLOCKER = "cudnn-sm12x-fusion-matmul-oob"
NVFP4_BLOCKER = "nvfp4-kv-cache-sm12x"
BAD_CUDNN = {"vllm": "0.25.1", "torch": "2.11.0", "cudnn_package": "nvidia-cudnn-cu13", "cudnn": "9.19.0.56"}
GOOD_CUDNN = {**BAD_CUDNN, "cudnn": "9.24.0.43"}
# The 48966 warning is always present on 0.25.1; accepting it keeps verdicts crisp.
EXIT0 = {"id": "vllm-api-server-exits-0-on-engine-death", "reason": "units use Restart=always"}


@pytest.fixture
def fleet(sim_nodes, tmp_path):
    nodes = sim_nodes({"sm120": "rtx_pro_6000", "sm121": "gb10", "sm100": "b200", "nodriver": None})
    inventory = simnode.write_inventory(nodes, tmp_path / "inventory.yml",
                                        {"canary": ["sm120"], "fleet": ["sm121", "sm100", "nodriver"]})
    return {n.name: n for n in nodes}, inventory


def preflight(inventory, tmp_path, *args, **extra):
    reports = tmp_path / "reports"
    run = ansible_playbook("playbooks/preflight.yml", inventory, *args,
                           extra_vars={"vllm_fleet_report_dir": str(reports),
                                       "vllm_fleet_accepted_risks": [EXIT0], **extra})
    report = json.loads((reports / "preflight.json").read_text()) if (reports / "preflight.json").exists() else None
    return run, report


def ids(findings):
    return {f["id"] for f in findings}


def test_cudnn_9_19_blocks_sm120_and_sm121_but_not_sm100(fleet, tmp_path):
    nodes, inventory = fleet
    run, report = preflight(inventory, tmp_path, vllm_fleet_release=BAD_CUDNN)

    assert run.rc != 0
    assert "Traceback" not in run.output
    assert report["sm120"]["report"]["verdict"] == "block"
    assert CUDNN_BLOCKER in ids(report["sm120"]["report"]["blockers"])
    assert CUDNN_BLOCKER in ids(report["sm121"]["report"]["blockers"])
    assert CUDNN_BLOCKER not in ids(report["sm100"]["report"]["planned"])
    assert report["sm100"]["report"]["verdict"] != "block"
    # The operator sees the finding and the fix in the failure itself.
    assert f"[{CUDNN_BLOCKER}]" in run.output
    assert "nvidia-cudnn-cu13" in run.output and "9.23.1" in run.output
    # The facts came through the real NVML path on each node.
    gpu = report["sm120"]["gpu"]["devices"][0]
    assert (gpu["compute_capability"], gpu["sm"]) == ("12.0", "sm_120")
    assert report["sm121"]["gpu"]["devices"][0]["sm"] == "sm_121"
    # No driver: a clear reason, not a traceback.
    assert report["nodriver"]["gpu"]["error"] == "library_not_found"
    assert "no usable GPU" in report["nodriver"]["report"]["message"]
    assert "nodriver" in run.output and "no usable GPU" in run.output


def test_cudnn_9_24_is_clean_on_every_gpu(fleet, tmp_path):
    nodes, inventory = fleet
    run, report = preflight(inventory, tmp_path, "--limit", "sm120,sm121,sm100",
                            vllm_fleet_release=GOOD_CUDNN)

    assert run.rc == 0, run.output[-3000:]
    for name in ("sm120", "sm121", "sm100"):
        assert report[name]["report"]["verdict"] == "pass", report[name]["report"]["summary"]
        assert report[name]["report"]["blockers"] == []


def test_nvfp4_kv_cache_blocks_on_sm120(fleet, tmp_path):
    nodes, inventory = fleet
    profile = {"name": "nvfp4-kv", "model": "/models/x",
               "serve_args": {"kv-cache-dtype": "nvfp4", "tensor-parallel-size": 1},
               "env": {"VLLM_USE_DEEP_GEMM_E8M0": "0"}}
    run, report = preflight(inventory, tmp_path, "--limit", "sm120,sm100",
                            vllm_fleet_release=GOOD_CUDNN, vllm_fleet_profile=profile)

    assert run.rc != 0
    assert ids(report["sm120"]["report"]["blockers"]) == {NVFP4_BLOCKER}
    assert NVFP4_BLOCKER not in ids(report["sm100"]["report"]["planned"])


def test_accepting_the_exact_blocker_lets_the_plan_through(fleet, tmp_path):
    nodes, inventory = fleet
    accepted = [EXIT0, {"id": CUDNN_BLOCKER, "reason": "reproducing the crash on the lab canary"}]
    run, report = preflight(inventory, tmp_path, "--limit", "sm120",
                            vllm_fleet_release=BAD_CUDNN, vllm_fleet_accepted_risks=accepted)

    assert run.rc == 0, run.output[-3000:]
    verdict = report["sm120"]["report"]
    assert verdict["verdict"] == "warn"
    assert [f["accepted_reason"] for f in verdict["accepted"] if f["id"] == CUDNN_BLOCKER] == \
        ["reproducing the crash on the lab canary"]


def install_current_release(node, wheelhouse, cudnn: str):
    """A serving release as a node would have it: a venv at /opt/vllm-fleet/current with
    torch and the cuDNN it pins (or an override), installed offline by pip on the node."""
    subprocess.run(["podman", "cp", str(wheelhouse), f"{node.container}:/srv/wheelhouse"], check=True)
    release = f"/opt/vllm-fleet/releases/test-{cudnn}"
    script = f"""set -e
python3 -m venv {release}
PIP_CONFIG_FILE=/dev/null {release}/bin/pip install -q --no-index --find-links /srv/wheelhouse torch==2.11.0
PIP_CONFIG_FILE=/dev/null {release}/bin/pip install -q --no-index --find-links /srv/wheelhouse --no-deps nvidia-cudnn-cu13=={cudnn}
ln -sfn {release} /opt/vllm-fleet/current"""
    result = node.exec(script, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory):
    from tests.fixtures.wheels.build import build_wheelhouse

    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


def test_current_release_is_judged_from_what_torch_loads_on_the_node(sim_nodes, tmp_path, wheelhouse):
    [node] = sim_nodes({"canary": "rtx_pro_6000"})
    inventory = simnode.write_inventory([node], tmp_path / "inventory.yml", {"canary": ["canary"]})
    install_current_release(node, wheelhouse, "9.19.0.56")

    run, report = preflight(inventory, tmp_path, vllm_fleet_release=GOOD_CUDNN)

    assert run.rc == 0, run.output[-3000:]
    canary = report["canary"]
    assert canary["cudnn_current"]["torch_cudnn_version"] == "9.19.0"
    assert ids(canary["report"]["current"]) >= {CUDNN_BLOCKER}
    assert canary["report"]["verdict"] == "pass"
    assert any("fixed by the planned config" in line for line in canary["report"]["summary"])


def test_preflight_changes_nothing_and_runs_in_check_mode(fleet, tmp_path):
    nodes, inventory = fleet
    before = nodes["sm120"].exec("find / -xdev -newer /etc/hostname -type f "
                                 "-not -path '/proc/*' -not -path '/run/*' -not -path '/var/log/*' "
                                 "-not -path '/tmp/*' -not -path '/var/tmp/*' -not -path '/root/.ansible/*' "
                                 "| sort").stdout
    run, report = preflight(inventory, tmp_path, "--check", "--limit", "sm120", vllm_fleet_release=GOOD_CUDNN)

    assert run.rc == 0, run.output[-3000:]
    assert "changed=0" in run.output
    assert report["sm120"]["report"]["verdict"] == "pass"
    after = nodes["sm120"].exec("find / -xdev -newer /etc/hostname -type f "
                                "-not -path '/proc/*' -not -path '/run/*' -not -path '/var/log/*' "
                                "-not -path '/tmp/*' -not -path '/var/tmp/*' -not -path '/root/.ansible/*' "
                                "| sort").stdout
    assert after == before
    assert nodes["sm120"].exec("test -e /opt/vllm-fleet").returncode != 0


@pytest.mark.parametrize("extra, expected", [
    ({"vllm_fleet_catalogue_path": "BAD_CATALOGUE"}, "field 'severity'"),
    ({"vllm_fleet_release": {**GOOD_CUDNN, "cudnn": "9.x.banana"}}, "9.x.banana"),
    ({"vllm_fleet_release": {**GOOD_CUDNN, "cudnn_package": "nvidia-cudnn-cu11"}}, "nvidia-cudnn-cu11"),
    ({"vllm_fleet_accepted_risks": [{"id": "no-such-issue", "reason": "x"}]}, "no-such-issue"),
])
def test_bad_input_gets_a_clear_error_and_changes_nothing(fleet, tmp_path, extra, expected):
    nodes, inventory = fleet
    if extra.get("vllm_fleet_catalogue_path") == "BAD_CATALOGUE":
        bad = tmp_path / "bad.yml"
        bad.write_text("schema_version: 1\nknown_issues:\n  - id: broken\n    title: t\n    severity: fatal\n"
                       "    match: {compute_capability: ['12.0']}\n    symptom: s\n    evidence: [e]\n    fix: f\n")
        extra = {"vllm_fleet_catalogue_path": str(bad)}
    run, _ = preflight(inventory, tmp_path, "--limit", "sm120", **extra)

    assert run.rc != 0
    assert expected in run.output
    assert "Traceback" not in run.output
    assert nodes["sm120"].exec("test -e /opt/vllm-fleet").returncode != 0


@pytest.fixture
def serving_fp8(sim_nodes, tmp_path):
    """A node that serves the shipped FP8 profile as far as preflight can tell: the
    profile.json that vllm_service records, made by the same code (serve_config.build)."""
    import yaml

    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import build
    from tests.fixtures.story import FP8
    from tests.integration.playbook import ROOT

    [node] = sim_nodes({"canary": "rtx_pro_6000"})
    schema = yaml.safe_load((ROOT / "catalogue" / "vllm_serve_args.yml").read_text())
    recorded = build(schema, FP8)["profile"]
    node.exec("mkdir -p /etc/vllm-fleet && cat > /etc/vllm-fleet/profile.json", input=json.dumps(recorded),
              check=True)
    return node, simnode.write_inventory([node], tmp_path / "inventory.yml", {"canary": ["canary"]})


def renamed(*names: str) -> dict:
    from tests.fixtures.story import NVFP4

    return {**NVFP4, "serve_args": {**NVFP4["serve_args"], "served-model-name": list(names)}}


def test_a_plan_that_takes_away_a_model_name_clients_use_is_refused(serving_fp8, tmp_path):
    from tests.fixtures.story import NVFP4, SERVED

    node, inventory = serving_fp8
    # The shipped NVFP4 profile keeps the FP8 profile's name: the quantization change passes.
    run, _ = preflight(inventory, tmp_path / "same", vllm_fleet_release=GOOD_CUDNN, vllm_fleet_profile=NVFP4)
    assert run.rc == 0, run.output[-3000:]
    # An alias added is no rename either.
    run, _ = preflight(inventory, tmp_path / "alias", vllm_fleet_release=GOOD_CUDNN,
                       vllm_fleet_profile=renamed(SERVED, "qwen-nvfp4"))
    assert run.rc == 0, run.output[-3000:]

    run, _ = preflight(inventory, tmp_path / "renamed", vllm_fleet_release=GOOD_CUDNN,
                       vllm_fleet_profile=renamed("qwen-nvfp4"))
    assert run.rc != 0
    assert (f"canary serves the model as {SERVED}; the profile qwen3.6-35b-a3b-nvfp4-sm120 would serve it as "
            f"qwen-nvfp4, and clients asking for {SERVED} would be refused") in " ".join(run.output.split()), \
        run.output[-3000:]
    assert "vllm_fleet_allow_model_rename" in run.output and "Traceback" not in run.output
    # A switch without a reason is no reason.
    run, _ = preflight(inventory, tmp_path / "bare", vllm_fleet_release=GOOD_CUDNN,
                       vllm_fleet_profile=renamed("qwen-nvfp4"), vllm_fleet_allow_model_rename=True)
    assert run.rc != 0 and "would be refused" in run.output, run.output[-3000:]

    run, _ = preflight(inventory, tmp_path / "allowed", vllm_fleet_release=GOOD_CUDNN,
                       vllm_fleet_profile=renamed("qwen-nvfp4"),
                       vllm_fleet_allow_model_rename="clients moved to qwen-nvfp4 (change 4711)")
    assert run.rc == 0, run.output[-3000:]
