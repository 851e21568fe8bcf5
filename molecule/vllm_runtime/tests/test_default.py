"""vllm_runtime on a simulated node: one release, the cuDNN override in effect, nothing serving touched."""
import json

ROOT = "/opt/vllm-fleet"
# The id the release_id filter gives the scenario's pins (docs/CONTRACTS.md, Releases).
RELEASE_ID = "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"
RELEASE = f"{ROOT}/releases/{RELEASE_ID}"


def test_release_and_manifest_exist(host):
    assert host.file(RELEASE).is_directory
    assert host.file(f"{RELEASE}/vllm-fleet-release.json").is_file
    assert host.file(f"{RELEASE}/lock.txt").contains("--hash=sha256:")


def test_manifest_records_the_intended_override(host):
    manifest = json.loads(host.file(f"{RELEASE}/vllm-fleet-release.json").content_string)
    assert manifest["release_id"] == RELEASE_ID
    assert manifest["overrides"] == ["nvidia-cudnn-cu13==9.24.0.43"]
    override = manifest["override"]
    assert override["intended"] is True
    assert override["version"] == "9.24.0.43"
    assert override["required_by"] == {"torch": ["nvidia-cudnn-cu13==9.19.0.56"]}
    assert manifest["check"]["unexpected"] == []
    assert manifest["check"]["expected"] == [
        "The package `torch` requires `nvidia-cudnn-cu13==9.19.0.56`, but `9.24.0.43` is installed"
    ]
    versions = {p["name"]: p["version"] for p in manifest["packages"]}
    assert versions["vllm"] == "0.25.1" and versions["torch"] == "2.11.0"
    assert versions["nvidia-cudnn-cu13"] == "9.24.0.43"
    assert all(p["hashes"] for p in manifest["packages"])
    assert manifest["cudnn"]["torch_cudnn_version_raw"] == 92400


def test_torch_in_the_release_loads_the_overridden_cudnn(host):
    cmd = host.run(f"{RELEASE}/bin/python -c 'import torch; print(torch.backends.cudnn.version())'")
    assert cmd.rc == 0, cmd.stderr
    assert cmd.stdout.strip() == "92400"


def test_the_vllm_command_runs_from_the_release(host):
    cmd = host.run(f"{RELEASE}/bin/vllm --version")
    assert cmd.rc == 0, cmd.stderr
    assert cmd.stdout.strip() == "0.25.1"


def test_tools_venv_has_uv(host):
    cmd = host.run(f"{ROOT}/tools/bin/uv --version")
    assert cmd.rc == 0, cmd.stderr
    assert cmd.stdout.split()[:2] == ["uv", "0.13.9"]


def test_nothing_serving_was_created_or_left_behind(host):
    # `current` and `known-good` belong to the service role's cutover.
    assert not host.file(f"{ROOT}/current").exists
    assert not host.file(f"{ROOT}/known-good").exists
    leftovers = host.run(f"ls -A {ROOT}/releases").stdout.split()
    assert leftovers == [RELEASE_ID]
