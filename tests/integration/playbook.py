"""Run this checkout's playbooks the way an operator does, from the repo root."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@dataclass
class Run:
    rc: int
    output: str


def ansible_playbook(playbook: str, inventory: Path, *args: str, extra_vars: dict | None = None,
                     timeout: float = 600) -> Run:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout + proc.stderr)


CLI = BIN / "vllm-fleet"


def vllm_fleet(tmp_path: Path, *args: str, timeout: float = 600):
    """Run the console script from a directory outside the checkout; return
    (exit code, output, summary, junit root). Artifacts go to tmp_path/run."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cmd = [str(CLI), *args, "--artifacts", str(tmp_path / "run"),
           "--json", str(tmp_path / "out" / "summary.json"), "--junit", str(tmp_path / "out" / "junit.xml")]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    junit = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    return proc.returncode, output, summary, junit
