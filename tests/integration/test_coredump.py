"""playbooks/coredump.yml on a simulated node: capture on, the stand-in vLLM crashes into a
root-only GPU core dump, collect it to the controller, triage it, capture off.

The node runs one vLLM instance, vllm@gpu0.service, from a venv installed offline from the
node wheelhouse (stand-in vllm 0.25.1, torch 2.11.0 and the cuDNN it pins, 9.19.0.56: the
crashing combination on the RTX PRO 6000 profile). The unit is a minimal one written here
with the hardening of roles/vllm_service that matters to a dump (its own user, UMask=0077,
ProtectSystem=strict with only its state directory writable, Restart=always).
"""
from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.simnode import simnode
from tests.integration.playbook import ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
CUDA_GDB = ROOT / "tests" / "fixtures" / "cuda_gdb" / "cuda-gdb"
CUDNN = "cudnn-sm12x-fusion-matmul-oob"
STORE = "/var/lib/vllm-fleet/coredumps"
DROP = "/var/lib/vllm-fleet/coredump-drop"
DROPIN = "/etc/systemd/system/vllm@gpu0.service.d/coredump.conf"
RELEASE = "/opt/vllm-fleet/releases/test-cudnn-9.19"

UNIT = """[Unit]
Description=vLLM test instance %i (minimal; roles/vllm_service writes the real one)
StartLimitIntervalSec=0

[Service]
Type=exec
User=vllm
Group=vllm
EnvironmentFile=/etc/vllm-fleet/%i.env
StateDirectory=vllm-fleet/%i
WorkingDirectory=%S/vllm-fleet/%i
ExecStart=/opt/vllm-fleet/current/bin/vllm serve /models/qwen3.6-35b-a3b-nvfp4 --host 127.0.0.1 \\
    --port ${VLLM_PORT} --max-model-len 8192 --kv-cache-dtype fp8
Restart=always
RestartSec=1
LimitCORE=0
UMask=0077
NoNewPrivileges=yes
CapabilityBoundingSet=
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectHostname=yes
"""

ENV = """VLLM_PORT={port}
CUDA_VISIBLE_DEVICES=0
VLLM_USE_DEEP_GEMM_E8M0=0
VLLM_STANDIN_LOAD_SECONDS=0.2
VLLM_STANDIN_TOKENS_PER_SECOND=50000
VLLM_STANDIN_STEP_SECONDS=0.005
VLLM_STANDIN_MEAN_STEPS_TO_CRASH=4
VLLM_STANDIN_EXIT_DELAY_SECONDS=0.5
VLLM_STANDIN_COREDUMP_WRITE_SECONDS=1
"""


def free_port() -> int:
    """A free loopback port in 8500-8599, this test's range (nodes share the host network)."""
    for port in range(8500, 8600):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8500-8599")


@pytest.fixture(scope="session")
def node_wheelhouse(tmp_path_factory):
    from tests.fixtures.wheels.build import build_node_wheelhouse

    return build_node_wheelhouse(tmp_path_factory.mktemp("node-wheelhouse"))


def sh(node, script: str, timeout: float = 120) -> str:
    result = node.exec(["bash", "-c", f"set -euo pipefail\n{script}"], timeout=timeout)
    assert result.returncode == 0, f"{script}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    return result.stdout


def unit_show(node, *props: str) -> dict[str, str]:
    out = sh(node, f"systemctl show vllm@gpu0.service {' '.join('-p ' + p for p in props)}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def http(port: int, path: str, payload: dict | None = None, timeout: float = 5) -> int:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"}, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def wait_until(predicate, timeout: float, what: str, node=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    journal = node.exec("journalctl --no-pager -n 60").stdout if node else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{journal}")


def install_instance(node, port: int) -> None:
    sh(node, f"""
useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vllm
python3 -m venv {RELEASE}
PIP_CONFIG_FILE=/dev/null {RELEASE}/bin/pip install -q --no-index --find-links /srv/wheelhouse vllm==0.25.1
ln -sfn {RELEASE} /opt/vllm-fleet/current
mkdir -p /etc/vllm-fleet
cat > /etc/vllm-fleet/gpu0.env <<'EOF'
{ENV.format(port=port)}EOF
cat > /etc/systemd/system/vllm@.service <<'EOF'
{UNIT}EOF
systemctl daemon-reload
systemctl start vllm@gpu0.service
""", timeout=240)


def coredump_playbook(inventory: Path, tmp_path: Path, action: str, *args: str, **extra):
    return ansible_playbook("playbooks/coredump.yml", inventory, "--limit", "gpu1", *args,
                            extra_vars={"vllm_fleet_coredump_action": action,
                                        "vllm_fleet_coredump_instances": ["gpu0"],
                                        "vllm_fleet_report_dir": str(tmp_path / "reports"), **extra})


def test_capture_crash_collect_triage_and_disable(sim_nodes, tmp_path, node_wheelhouse):
    timings = {"start": time.monotonic()}
    [node] = sim_nodes({"gpu1": "rtx_pro_6000"}, volumes=(f"{node_wheelhouse}:/srv/wheelhouse:ro",))
    inventory = simnode.write_inventory([node], tmp_path / "inventory.yml")
    port = free_port()
    install_instance(node, port)
    wait_until(lambda: http(port, "/health") == 200, 30, "the instance to serve", node)
    first_pid = unit_show(node, "MainPID")["MainPID"]
    timings["instance"] = time.monotonic()

    # --- capture on
    run = coredump_playbook(inventory, tmp_path, "enable")
    assert run.rc == 0, run.output[-4000:]
    timings["enable"] = time.monotonic()
    dropin = sh(node, f"cat {DROPIN}")
    assert "Environment=CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1" in dropin
    assert f'Environment="CUDA_COREDUMP_FILE={DROP}/core_%%h.%%p.%%t.nvcudmp"' in dropin
    assert "LimitCORE=infinity" in dropin and f"ReadWritePaths={DROP}" in dropin
    assert "skip_abort" not in dropin
    shown = unit_show(node, "Environment", "LimitCORE", "MainPID")
    # systemd, not the driver, would have eaten a single %: the unit hands the driver the pattern.
    assert f"CUDA_COREDUMP_FILE={DROP}/core_%h.%p.%t.nvcudmp" in shown["Environment"].split()
    assert shown["LimitCORE"] == "infinity"
    assert shown["MainPID"] != first_pid, "a running instance is restarted to take capture on"
    assert sh(node, f"stat -c '%U:%G %a' {STORE} {DROP}").split("\n")[:2] == ["root:root 700", "root:vllm 730"]
    assert sh(node, "systemctl is-active vllm-fleet-coredump.path").strip() == "active"
    # Enabling again changes nothing and restarts nothing.
    again = coredump_playbook(inventory, tmp_path, "enable")
    assert again.rc == 0 and "changed=0" in again.output, again.output[-3000:]
    assert unit_show(node, "MainPID")["MainPID"] == shown["MainPID"]

    # --- the crash: sm_120 + cuDNN 9.19 under a little load
    wait_until(lambda: http(port, "/health") == 200, 30, "the instance to serve again", node)
    prompt = {"prompt": "word " * 400, "max_tokens": 32, "ignore_eos": True}
    restarts = unit_show(node, "NRestarts")["NRestarts"]

    def crashed():
        http(port, "/v1/completions", prompt, timeout=3)
        return unit_show(node, "NRestarts")["NRestarts"] != restarts
    wait_until(crashed, 60, "the instance to crash", node)
    dumps = wait_until(lambda: sh(node, f"ls -A {STORE}").split(), 20, "a dump in the store", node)
    timings["crash"] = time.monotonic()
    [dump] = dumps
    assert dump.startswith("core_gpu1.") and dump.endswith(".nvcudmp")
    journal = sh(node, "journalctl --no-pager -u vllm@gpu0.service -u vllm-fleet-coredump.service")
    assert f"coredump: Writing ELF file to {DROP}/{dump}" in journal
    # The driver aborts the EngineCore child; the API server exits 0 and Restart=always restarts it.
    assert "[shutdown] MPClient: engine core exited unexpectedly" in journal and "status=6/ABRT" not in journal
    assert f"moved {dump} to {STORE}/{dump} (root:root 0600" in journal

    # Root-only: the store and the dump, and the service user can neither read nor list.
    assert sh(node, f"stat -c '%U:%G %a' {STORE}/{dump}").strip() == "root:root 600"
    assert sh(node, f"ls -A {DROP}").strip() == ""
    as_vllm = "setpriv --reuid=vllm --regid=vllm --init-groups"
    for attempt in (f"cat {STORE}/{dump}", f"ls {STORE}", f"ls {DROP}"):
        denied = node.exec(f"{as_vllm} {attempt}")
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (attempt, denied)
    # ... but it can still create a dump in the drop directory.
    assert node.exec(f"{as_vllm} sh -c ': > {DROP}/probe'").returncode == 0
    wait_until(lambda: sh(node, f"ls -A {DROP}").strip() == "", 10, "the mover to take the probe", node)
    sh(node, f"rm -f {STORE}/probe")

    # --- collect to the controller and triage
    # The dump was written over a second (VLLM_STANDIN_COREDUMP_WRITE_SECONDS) after the mover
    # had already renamed it: it must be whole.
    time.sleep(2)
    run = coredump_playbook(inventory, tmp_path, "collect", vllm_fleet_coredump_cuda_gdb=str(CUDA_GDB),
                            vllm_fleet_coredump_settle_seconds=2)
    assert run.rc == 0, run.output[-4000:]
    timings["collect"] = time.monotonic()
    local = tmp_path / "reports" / "coredumps" / "gpu1"
    assert (local / dump).is_file()
    assert oct(local.stat().st_mode & 0o777) == "0o700" and oct((local / dump).stat().st_mode & 0o777) == "0o600"
    report = json.loads((local / "triage.json").read_text())
    [entry] = report["dumps"]
    assert entry["known_issue"] == CUDNN, entry
    assert "nvidia-cudnn-cu13>=9.23.1" in entry["fix"]
    assert entry["kernel"].startswith("cudnn_generated_fort_native_sm120_matMul")
    assert entry["exception"] in ("Warp Out-of-range Address", "Warp Misaligned Address")
    assert entry["instruction"].startswith("STS.") and entry["instruction_offset"] > 0
    assert entry["node_path"] == f"{STORE}/{dump}"
    assert f"known issue {CUDNN}" in run.output and "Fix: Install nvidia-cudnn-cu13>=9.23.1" in " ".join(
        run.output.split())
    assert sh(node, f"ls -A {STORE}").split() == [dump], "collect keeps the node's copy unless asked to purge"

    # --- capture off
    pid = unit_show(node, "MainPID")["MainPID"]
    run = coredump_playbook(inventory, tmp_path, "disable", vllm_fleet_coredump_remove_mover=True)
    assert run.rc == 0, run.output[-4000:]
    timings["disable"] = time.monotonic()
    assert node.exec(f"test -e {DROPIN}").returncode != 0
    shown = unit_show(node, "Environment", "LimitCORE", "MainPID")
    assert "CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1" not in shown["Environment"].split()
    assert shown["LimitCORE"] == "0"
    assert shown["MainPID"] != pid, "a running instance is restarted to take capture off"
    # Asked to, and with no instance capturing, the mover goes too.
    assert node.exec("test -e /etc/systemd/system/vllm-fleet-coredump.path").returncode != 0
    assert node.exec("test -e /usr/local/sbin/vllm-fleet-coredump-move").returncode != 0
    assert sh(node, "systemctl is-active vllm-fleet-coredump.path || true").strip() in ("inactive", "unknown")
    assert sh(node, f"ls -A {STORE}").split() == [dump], "the dumps stay"
    wait_until(lambda: http(port, "/health") == 200, 30, "the instance to serve without capture", node)

    print("timings (s):", {k: round(v - timings["start"], 1) for k, v in timings.items() if k != "start"})


def test_enable_refuses_the_whole_inventory_and_a_node_without_the_unit(sim_nodes, tmp_path):
    [node] = sim_nodes({"gpu1": "rtx_pro_6000"})
    inventory = simnode.write_inventory([node], tmp_path / "inventory.yml")
    unlimited = ansible_playbook("playbooks/coredump.yml", inventory,
                                 extra_vars={"vllm_fleet_coredump_action": "enable"})
    assert unlimited.rc != 0 and "pick the nodes with --limit" in unlimited.output

    no_group = coredump_playbook(inventory, tmp_path, "enable")
    assert no_group.rc != 0 and "group vllm does not exist on gpu1" in no_group.output, no_group.output[-3000:]
    sh(node, "groupadd --system vllm")
    no_unit = coredump_playbook(inventory, tmp_path, "enable")
    assert no_unit.rc != 0 and "no unit vllm@gpu0.service on gpu1" in no_unit.output, no_unit.output[-3000:]
    assert node.exec(f"test -e {DROP}").returncode != 0, "nothing is written before the checks pass"

    # Check mode on a node that has the unit: says what it would do, writes nothing.
    sh(node, "printf '[Service]\\nExecStart=/bin/sleep infinity\\n' > /etc/systemd/system/vllm@.service "
             "&& systemctl daemon-reload && systemctl start vllm@gpu0.service")
    pid = unit_show(node, "MainPID")["MainPID"]
    check = coredump_playbook(inventory, tmp_path, "enable", "--check")
    assert check.rc == 0, check.output[-3000:]
    assert "changed=" in check.output and "changed=0" not in check.output
    for path in (DROP, STORE, DROPIN, "/etc/systemd/system/vllm-fleet-coredump.path"):
        assert node.exec(f"test -e {path}").returncode != 0, path
    assert unit_show(node, "MainPID")["MainPID"] == pid

    bad = coredump_playbook(inventory, tmp_path, "enable",
                            vllm_fleet_coredump_generation_flags=["skip_global_memory", "skip_abort"])
    assert bad.rc != 0 and "never skip_abort" in bad.output
    wrong = ansible_playbook("playbooks/coredump.yml", inventory, extra_vars={"vllm_fleet_coredump_action": "dump"})
    assert wrong.rc != 0 and "vllm_fleet_coredump_action" in wrong.output

    nothing = coredump_playbook(inventory, tmp_path, "collect", vllm_fleet_coredump_settle_seconds=0)
    assert nothing.rc == 0, nothing.output[-3000:]
    assert "0 dump(s) collected" in nothing.output
