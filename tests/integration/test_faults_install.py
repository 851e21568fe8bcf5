"""The fault matrix, part 1 (docs/FAULTS.md): what goes wrong before a node's turn, in
preflight or while the release is pre-staged, on a fleet of two sm_120 nodes behind a real
HAProxy that serves the pre-fix release as provisioned. Each fault halts the rollout before
any node leaves traffic, and the re-run converges. Tests run in file order on one fleet,
each starting where the one before converged, so that every converging re-run is a real
install or cutover, not a skip. The faults during a turn are in test_faults.py.
"""
from __future__ import annotations

import os

import pytest

from tests.fixtures.story import FIXED, FIXED_ID, NVFP4, PRE_FIX_ID, node_exec, provisioned_fleet, report, state
from tests.integration.faults import (FAST, NODES, assert_converges, assert_halted_before_any_change, rollout,
                                      staged)

# A second cuDNN-only bump, in the test wheelhouse: a release no node has staged yet.
BUMP = {**FIXED, "cudnn": "9.23.1.21"}
BUMP_ID = "vllm-0.25.1_nvidia-cudnn-cu13-9.23.1.21"
# /opt/vllm-fleet on a disk of its own, so that one can be filled.
DISK = "/opt/vllm-fleet:rw,exec,nosuid,nodev,mode=0755,size=768m"


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("faults-install"), f"vf-install-{os.getpid()}-",
                           len(NODES), group_vars=FAST, tmpfs=(DISK,)) as sim:
        yield sim


def test_a_gpu_with_retired_pages_pending_blocks_the_plan_before_anything_changes(fleet):
    gpu = fleet.gpu_profile("node01")
    healthy = gpu.read_text()
    before = {node: state(fleet, node) for node in NODES}
    gpu.write_text(healthy.replace("0.retired_pages_pending=0", "0.retired_pages_pending=1"))  # in place: bind mount
    try:
        run, traffic = rollout(fleet, "--limit", "canary", release=FIXED, profile_=NVFP4)
    finally:
        gpu.write_text(healthy)  # the GPU was reset

    assert_halted_before_any_change(run, traffic, fleet, before, "gpu-retired-pages-pending", "node01")
    assert FIXED_ID not in staged(fleet, "node01")

    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=NVFP4,
                     serving={"node01": (FIXED_ID, NVFP4["name"])})


def test_a_full_disk_during_the_install_halts_before_the_node_leaves_traffic(fleet):
    before = {node: state(fleet, node) for node in NODES}
    # Fill node02's /opt/vllm-fleet to the last block.
    node_exec(fleet, "node02", "cd /opt/vllm-fleet && fallocate -l $(df --output=avail -B1 . | tail -1) ballast;"
                               " dd if=/dev/zero of=ballast2 bs=4k 2>/dev/null; true")
    assert node_exec(fleet, "node02", "df --output=avail /opt/vllm-fleet | tail -1") == "0"
    try:
        run, traffic = rollout(fleet, release=FIXED, profile_=NVFP4)
    finally:
        node_exec(fleet, "node02", "rm -f /opt/vllm-fleet/ballast /opt/vllm-fleet/ballast2")

    assert_halted_before_any_change(run, traffic, fleet, before, "No space left on device", "node02",
                                    f"release {FIXED_ID}")
    assert staged(fleet, "node02") == {PRE_FIX_ID}  # no half-built release, no staging left behind

    assert_converges(fleet, release=FIXED, profile_=NVFP4, serving={n: (FIXED_ID, NVFP4["name"]) for n in NODES})
    assert (report(fleet, "node01")["status"], report(fleet, "node02")["status"]) == ("skipped", "upgraded")


def test_an_unreachable_index_halts_the_install_before_anything_changes(fleet):
    """Its credentials are written only to root-only files uv and pip read: never on a
    command line (ps, the node's journal records a module's arguments) nor in Ansible's
    output, even at -vvv; messages show the URL redacted."""
    before = {node: state(fleet, node) for node in NODES}
    secret = "s3cret-token-4242"
    dead_index = f"http://fleet:{secret}@127.0.0.1:9/simple"  # discard port: nothing listens
    # A credential in vllm_fleet_runtime_environment too (uv's form for a named index's password).
    env_secret = "env-s3cret-2424"
    since = node_exec(fleet, "node01", "date +%s")
    # Control: the journal search below sees what was logged on the node during the run.
    node_exec(fleet, "node01", "logger -t vllm-fleet-test journal-search-control")
    run, traffic = rollout(fleet, "--limit", "canary", "-vvv", release=BUMP, profile_=NVFP4,
                           vllm_fleet_runtime_offline=False, vllm_fleet_runtime_find_links=[],
                           vllm_fleet_runtime_index_url=dead_index,
                           vllm_fleet_runtime_environment={"UV_INDEX_FLEET_PASSWORD": env_secret})

    assert_halted_before_any_change(run, traffic, fleet, before, "http://<redacted>@127.0.0.1:9/simple",
                                    f"release {BUMP_ID}")
    assert BUMP_ID not in staged(fleet, "node01") and not any(s.startswith(".staging") for s in staged(fleet, "node01"))
    # -vvv prints each task's remote command line, where `environment:` values would be.
    assert "EXEC" in run.output and secret not in run.output and env_secret not in run.output
    journal = node_exec(fleet, "node01", f"journalctl --no-pager -o cat --since @{since}")
    assert "journal-search-control" in journal and secret not in journal and env_secret not in journal
    assert node_exec(fleet, "node01", "stat -c '%a %U' /opt/vllm-fleet/sources /opt/vllm-fleet/sources/uv.toml "
                                      "/opt/vllm-fleet/sources/pip.conf /opt/vllm-fleet/sources/environment.json"
                     ).splitlines() == ["700 root", "600 root", "600 root", "600 root"]
    assert env_secret in node_exec(fleet, "node01", "cat /opt/vllm-fleet/sources/environment.json")
    assert f'index-url = "{dead_index}"' in node_exec(fleet, "node01", "cat /opt/vllm-fleet/sources/uv.toml")

    assert_converges(fleet, "--limit", "canary", release=BUMP, profile_=NVFP4,
                     serving={"node01": (BUMP_ID, NVFP4["name"])})


def test_a_wheel_missing_from_the_wheelhouse_halts_the_install_naming_it(fleet):
    before = {node: state(fleet, node) for node in NODES}
    run, traffic = rollout(fleet, "--limit", "canary", release={**FIXED, "cudnn": "9.23.1.99"}, profile_=NVFP4)

    assert_halted_before_any_change(run, traffic, fleet, before, "nvidia-cudnn-cu13==9.23.1.99", "/srv/wheelhouse")
    assert not any(s.startswith(".staging") or "9.23.1.99" in s for s in staged(fleet, "node01"))

    # The pin corrected to the fixed release (staged, not served): a cutover, not an install.
    assert_converges(fleet, "--limit", "canary", release=FIXED, profile_=NVFP4,
                     serving={"node01": (FIXED_ID, NVFP4["name"])})
