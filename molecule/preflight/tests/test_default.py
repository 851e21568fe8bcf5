"""preflight on a simulated node with a fake RTX PRO 6000: the GPU as NVML reports it, the
default plan judged without a blocker, the report on the controller, nothing written on the node."""
import json
import os
from pathlib import Path

REPORT = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports" / "preflight.json"


def node_report():
    (report,) = json.loads(REPORT.read_text()).values()
    return report


def test_the_report_holds_the_gpu_nvml_reports():
    gpu = node_report()["gpu"]
    assert gpu["available"] is True and gpu["device_count"] == 1
    (device,) = gpu["devices"]
    assert "RTX PRO 6000" in device["name"]
    assert device["compute_capability"] == "12.0"


def test_the_default_plan_has_no_blocker_on_sm120():
    report = node_report()
    assert report["release"]["cudnn"] == "9.24.0.43"
    verdict = report["report"]
    assert verdict["blockers"] == [], verdict["summary"]
    # vLLM 0.25.1's API server exits 0 when its engine dies: a warning, which the unit's
    # Restart=always and the watchdog answer.
    assert [w["id"] for w in verdict["warnings"]] == ["vllm-api-server-exits-0-on-engine-death"]
    assert verdict["verdict"] == "warn"


def test_a_node_that_serves_nothing_has_no_current_release_and_is_not_an_error():
    assert node_report()["cudnn_current"]["status"] == "no_venv"


def test_preflight_wrote_nothing_on_the_node(host):
    assert not host.file("/opt/vllm-fleet").exists
    assert not host.file("/etc/vllm-fleet").exists
