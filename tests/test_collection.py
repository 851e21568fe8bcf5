"""The collection as a whole: module docs render, playbooks parse, ansible-lint passes."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
PLAYBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "playbooks").glob("*.yml"))
ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
}


def run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


def test_every_module_is_listed():
    assert {"gpu_facts", "cudnn_facts", "preflight"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_docs_render(module):
    result = run(str(BIN / "ansible-doc"), f"vllm_fleet.fleet.{module}")
    assert result.returncode == 0, result.stderr
    for section in ("OPTIONS", "EXAMPLES", "RETURN VALUES"):
        assert section in result.stdout, f"{module}: ansible-doc shows no {section}"
    assert "ERROR" not in result.stderr


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook):
    result = run(str(BIN / "ansible-playbook"), "--syntax-check", playbook)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile(tmp_path):
    # --offline makes ansible-lint put $ANSIBLE_HOME/collections (~/.ansible) first: a copy of
    # this collection installed there once would be linted against instead of the checkout.
    result = subprocess.run((str(BIN / "ansible-lint"), "--offline", "--nocolor", "-q"), cwd=ROOT,
                            env={**ENV, "ANSIBLE_HOME": str(tmp_path)}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
