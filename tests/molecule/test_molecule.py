"""Every Molecule scenario under molecule/, end to end: `molecule test -s <scenario>`.

The node's fixtures (image, fake NVML, GPU profile, wheelhouse) are built once per session
by the builder each scenario's `dependency` step also runs (tests/fixtures/molecule_node.py),
into the place .config/molecule/config.yml reads them from; that step then finds them ready.
A new directory molecule/<name>/ with a molecule.yml is picked up by itself.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
# Rootful podman, like tests/integration.
pytestmark = pytest.mark.integration
TIMEOUT = 900


@pytest.fixture(scope="session")
def molecule_env() -> dict:
    from tests.fixtures.molecule_node import FixtureError, build

    try:
        build()
    except FixtureError as exc:
        pytest.fail(str(exc), pytrace=False)
    _remove_stale_instances()
    return {
        **os.environ,
        # Instance names carry it (.config/molecule/config.yml): concurrent sessions on one
        # host do not share containers.
        "VLLM_FLEET_MOLECULE_RUN": str(os.getpid()),
        # ansible-lint and Molecule ignore collections_path in ansible.cfg.
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
        "PY_COLORS": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }


def _remove_stale_instances() -> None:
    """Remove the instances of runs whose process is gone (killed before their destroy)."""
    listing = subprocess.run(["podman", "ps", "-a", "--filter", "label=owner=molecule", "--format", "{{.Names}}"],
                             capture_output=True, text=True, timeout=60)
    for name in listing.stdout.split():
        match = re.match(r"^vf-mol-(\d+)-", name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            subprocess.run(["podman", "rm", "-f", "-t", "5", name], capture_output=True, timeout=60)


def run_scenario(scenario, molecule_env, record_property, tmp_path):
    # Its own state directory: a concurrent session's run of the same scenario is not ours.
    molecule_env = {**molecule_env, "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path / "molecule")}
    started = time.monotonic()
    try:
        proc = subprocess.run([str(BIN / "molecule"), "test", "-s", scenario], cwd=ROOT, env=molecule_env,
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        subprocess.run([str(BIN / "molecule"), "destroy", "-s", scenario], cwd=ROOT, env=molecule_env,
                       capture_output=True, timeout=120)
        pytest.fail(f"molecule test -s {scenario} ran past {TIMEOUT} s; its output ended:\n{output[-8000:]}",
                    pytrace=False)
    seconds = time.monotonic() - started
    record_property("seconds", round(seconds, 1))
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"molecule test -s {scenario} exited {proc.returncode} after {seconds:.0f} s; "
                    f"the end of its output:\n{output[-8000:]}", pytrace=False)
    print(f"molecule test -s {scenario}: {seconds:.1f} s")


def _scenario_class(scenario: str) -> type:
    """One test class per scenario: `make test` schedules by scope (--dist loadscope), so each
    scenario runs on a worker of its own while a file's functions stay together. (loadgroup
    would say it directly, but pytest-xdist 3.8 marks groups in Item._nodeid, which pytest
    9.2 no longer reads.)"""
    def test_molecule(self, molecule_env, record_property, tmp_path):
        run_scenario(scenario, molecule_env, record_property, tmp_path)

    name = f"TestScenario_{scenario}"
    return type(name, (), {"test_molecule": test_molecule, "__qualname__": name, "__module__": __name__})


for _scenario in SCENARIOS:
    globals()[f"TestScenario_{_scenario}"] = _scenario_class(_scenario)
