"""The core-dump mover's unit and script (roles/coredump), issue 14:
- the rendered vllm-fleet-coredump.service scores <= 2.0 in `systemd-analyze security
  --offline=yes` (systemd's own scoring of the file; the controller's systemd-analyze), with a
  negative control: the unit as it was before (6.3) fails the same gate;
- the mover logs a file name the serving user chose with its newline or escape sequence
  escaped, so it cannot forge a journal line; a plain name is logged as it is."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "coredump"
MOVER = ROLE / "files" / "coredump-move"
GATE = 2.0
VARS = {"vllm_fleet_coredump_drop_dir": "/var/lib/vllm-fleet/coredump-drop",
        "vllm_fleet_coredump_dir": "/var/lib/vllm-fleet/coredumps",
        "vllm_fleet_coredump_python": "/usr/bin/python3",
        "_vllm_fleet_coredump_mover": "/usr/local/libexec/vllm-fleet/coredump-move"}
BEFORE = """[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /usr/local/libexec/vllm-fleet/coredump-move /a /b
UMask=0077
ProtectSystem=strict
ReadWritePaths=/a /b
ProtectHome=yes
PrivateTmp=yes
PrivateNetwork=yes
NoNewPrivileges=yes
CapabilityBoundingSet=CAP_CHOWN CAP_FOWNER CAP_DAC_OVERRIDE
"""

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")


def exposure(tmp_path: Path, text: str) -> float:
    unit = tmp_path / "vllm-fleet-coredump.service"
    unit.write_text(text)
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
                         capture_output=True, text=True, check=False).stdout
    return float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))


def rendered() -> str:
    template = (ROLE / "templates" / "vllm-fleet-coredump.service.j2").read_text()
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(**VARS)


@needs_analyze
def test_the_mover_unit_scores_at_most_2(tmp_path):
    score = exposure(tmp_path, rendered())
    print(f"\nsystemd-analyze security vllm-fleet-coredump.service (offline): {score}")
    assert score <= GATE


@needs_analyze
def test_the_unit_as_it_was_fails_the_gate(tmp_path):  # negative control
    assert exposure(tmp_path, BEFORE) > GATE


def move(tmp_path: Path, names: list[str]) -> str:
    drop, store = tmp_path / "drop", tmp_path / "store"
    drop.mkdir()
    store.mkdir()
    for name in names:
        (drop / name).write_bytes(b"core")
    proc = subprocess.run([sys.executable, str(MOVER), str(drop), str(store)], capture_output=True, text=True,
                          check=False)
    if os.geteuid() != 0:
        pytest.skip("the mover chowns to root")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_name_with_a_newline_cannot_forge_a_log_line(tmp_path):
    out = move(tmp_path, ["core.1\nmoved evil to the store (root:root 0600)", "core.\x1b[2J"])
    lines = out.splitlines()
    assert len(lines) == 3, out  # two dumps and the total, nothing forged
    assert not any(line.startswith("moved evil") for line in lines)
    assert "'core.1\\nmoved evil" in out and "'core.\\x1b[2J'" in out


def test_a_plain_name_is_logged_as_it_is(tmp_path):  # negative control
    out = move(tmp_path, ["core.vllm.1234"])
    assert out.startswith("moved core.vllm.1234 to ")


# Every service unit of the collection, rendered with its role's usual values, gated offline.
OTHER_UNITS = {
    "vllm@.service": (ROOT / "roles" / "vllm_service" / "templates" / "vllm@.service.j2", {
        "_vllm_fleet_service_current": "/opt/vllm-fleet/current",
        "_vllm_fleet_service_helper": "/usr/local/libexec/vllm-fleet/vllm-fleet-exec",
        "_vllm_fleet_service_key_file": "/etc/vllm-fleet/api-key.env", "ansible_managed": "Managed by Ansible",
        "vllm_fleet_config_dir": "/etc/vllm-fleet", "vllm_fleet_service_group": "vllm",
        "vllm_fleet_service_user": "vllm", "vllm_fleet_service_helper_python": "/usr/bin/python3",
        "vllm_fleet_service_api_key": "k" * 20, "vllm_fleet_service_ip_address_allow": [],
        "vllm_fleet_service_device_allow": ["/dev/nvidiactl rw", "/dev/nvidia0 rw", "/dev/nvidia-uvm rw"],
        "vllm_fleet_service_limit_core": 0, "vllm_fleet_service_restart_sec": 5,
        "vllm_fleet_service_start_limit_burst": 5, "vllm_fleet_service_start_limit_interval_sec": 600,
        "vllm_fleet_service_timeout_start_sec": 900, "vllm_fleet_service_timeout_stop_sec": 60}),
    "vllm-fleet-watchdog@.service": (ROOT / "roles" / "vllm_watchdog" / "templates" / "vllm-fleet-watchdog@.service.j2", {
        "_vllm_fleet_watchdog_host_is_ip": True, "_vllm_fleet_watchdog_host_is_loopback": True,
        "vllm_fleet_watchdog_http_timeout_s": 5, "_vllm_fleet_watchdog_config": "/etc/vllm-fleet/watchdog.json",
        "_vllm_fleet_watchdog_program": "/usr/local/libexec/vllm-fleet/vllm-fleet-watchdog",
        "ansible_managed": "Managed by Ansible", "vllm_fleet_watchdog_host": "127.0.0.1",
        "vllm_fleet_watchdog_python": "/usr/bin/python3"}),
}


@needs_analyze
@pytest.mark.parametrize("unit", OTHER_UNITS)
def test_every_service_unit_scores_at_most_2(unit, tmp_path):
    path, values = OTHER_UNITS[unit]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["comment"] = lambda text: f"#\n# {text}\n#"
    score = exposure(tmp_path, env.from_string(path.read_text()).render(**values))
    print(f"\nsystemd-analyze security {unit} (offline): {score}")
    assert score <= GATE
