"""The vllm_runtime role against simulated nodes: real uv, real resolver, real venvs.

The node gets the wheelhouse (stand-in cuDNN/torch/vllm wheels and the real nvidia-ml-py,
pyyaml and uv) copied in with `podman cp`: simnode.start_node has no option to mount it.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.simnode import simnode
from tests.integration.playbook import ansible_playbook

ROOT_DIR = "/opt/vllm-fleet"
WHEELHOUSE = "/srv/wheelhouse"
PLAN = {"vllm": "0.25.1", "torch": "2.11.0", "cudnn_package": "nvidia-cudnn-cu13", "cudnn": "9.24.0.43"}
RID = "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"
RELEASE = f"{ROOT_DIR}/releases/{RID}"
OVERRIDE_LINE = "The package `torch` requires `nvidia-cudnn-cu13==9.19.0.56`, but `9.24.0.43` is installed"
PLAYBOOK = """\
- name: Install the planned release
  hosts: all
  gather_facts: false
  roles:
    - role: vllm_fleet.fleet.vllm_runtime
"""


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    from tests.fixtures.wheels.build import build_node_wheelhouse

    return build_node_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="module")
def wheelhouse_without_new_cudnn(wheelhouse, tmp_path_factory) -> Path:
    partial = tmp_path_factory.mktemp("wheelhouse-partial")
    for wheel in wheelhouse.glob("*.whl"):
        if not wheel.name.startswith("nvidia_cudnn_cu13-9.24.0.43-"):
            shutil.copyfile(wheel, partial / wheel.name)
    return partial


@pytest.fixture
def node(sim_nodes, tmp_path):
    """One node (no GPU needed to build a release) and its inventory."""
    (node,) = sim_nodes({"rt": None})
    return node, simnode.write_inventory([node], tmp_path / "inventory.yml")


def copy_wheelhouse(node, source: Path) -> None:
    subprocess.run(["podman", "cp", f"{source}/.", f"{node.container}:{WHEELHOUSE}"], check=True,
                   capture_output=True, timeout=120)


def run_role(inventory: Path, tmp_path: Path, *args: str, **extra):
    playbook = tmp_path / "runtime.yml"
    playbook.write_text(PLAYBOOK)
    variables = {"vllm_fleet_release": PLAN, "vllm_fleet_runtime_offline": True,
                 "vllm_fleet_runtime_find_links": [WHEELHOUSE], **extra}
    started = time.monotonic()
    run = ansible_playbook(str(playbook), inventory, *args, extra_vars=variables)
    return run, time.monotonic() - started


def recap(output: str, host: str = "rt") -> dict:
    match = re.search(rf"^{host}\s+:\s+(.*)$", output, re.MULTILINE)
    assert match, output[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def flat(output: str) -> str:
    """Ansible's output with its line wrapping undone, to find a message in it."""
    return " ".join(output.split())


def sh(node, cmd: str) -> str:
    result = node.exec(cmd)
    assert result.returncode == 0, f"{cmd}: {result.stderr}"
    return result.stdout


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_release_with_cudnn_override_installs_verifies_and_is_idempotent(node, wheelhouse, tmp_path, record_property):
    node, inventory = node
    copy_wheelhouse(node, wheelhouse)

    # Check mode says what it would do and creates nothing.
    run, _ = run_role(inventory, tmp_path, "--check")
    assert run.rc == 0, run.output[-4000:]
    assert f"would install release {RID}" in run.output
    assert node.exec(f"test -e {ROOT_DIR}").returncode != 0

    run, seconds = run_role(inventory, tmp_path)
    assert run.rc == 0, run.output[-6000:]
    record_property("install_seconds", round(seconds, 1))
    print(f"\nfirst install of {RID} from the wheelhouse: {seconds:.1f} s (ansible-playbook wall time)")

    # torch in the release loads the overridden cuDNN, not its own pin's.
    assert sh(node, f"{RELEASE}/bin/python -c 'import torch; print(torch.backends.cudnn.version())'").strip() == "92400"
    # The console script survived the staging -> release rename, also through a link.
    assert sh(node, f"{RELEASE}/bin/vllm --version").strip() == "0.25.1"
    assert ".staging-" not in sh(node, f"head -c 300 {RELEASE}/bin/vllm")
    assert sh(node, f"ln -s {RELEASE} /tmp/via-link && /tmp/via-link/bin/vllm --version").strip() == "0.25.1"

    manifest = json.loads(sh(node, f"cat {RELEASE}/vllm-fleet-release.json"))
    assert manifest["release_id"] == RID
    assert manifest["override"]["intended"] is True
    assert manifest["override"]["required_by"] == {"torch": ["nvidia-cudnn-cu13==9.19.0.56"]}
    assert manifest["check"] == {**manifest["check"], "expected": [OVERRIDE_LINE], "unexpected": []}
    assert manifest["cudnn"]["torch_cudnn_version"] == "9.24.0"
    assert manifest["tools"]["uv"] == "0.13.9"
    # Every package resolved, each with the hash of the very wheel in the wheelhouse.
    wheels = {p.name.split("-")[0].replace("_", "-").lower() + "==" + p.name.split("-")[1]: p
              for p in wheelhouse.glob("*.whl")}
    packages = {f"{p['name']}=={p['version']}": p["hashes"] for p in manifest["packages"]}
    assert set(packages) == {"vllm==0.25.1", "torch==2.11.0", "nvidia-cudnn-cu13==9.24.0.43",
                             "nvidia-ml-py==13.615.71", "pyyaml==6.0.4"}
    for pin, hashes in packages.items():
        assert hashes == [sha256(wheels[pin])], pin

    assert sh(node, f"{ROOT_DIR}/tools/bin/uv --version").split()[:2] == ["uv", "0.13.9"]
    assert sh(node, f"find {RELEASE} -perm -o+w ! -type l") == ""  # uv's .lock is 0666
    assert sh(node, f"ls -A {ROOT_DIR}/releases").split() == [RID]
    assert node.exec(f"test -e {ROOT_DIR}/current || test -e {ROOT_DIR}/known-good").returncode != 0

    # Again: nothing to do, the manifest untouched.
    before = sh(node, f"stat -c %Y {RELEASE}/vllm-fleet-release.json")
    run, seconds = run_role(inventory, tmp_path)
    assert run.rc == 0, run.output[-4000:]
    assert recap(run.output)["changed"] == 0, run.output[-4000:]
    assert sh(node, f"stat -c %Y {RELEASE}/vllm-fleet-release.json") == before
    print(f"second run (nothing to do): {seconds:.1f} s")

    # playbooks/verify.yml re-hashes the release: untouched, no drift (the negative control) ...
    started = time.monotonic()
    run = ansible_playbook("playbooks/verify.yml", inventory)
    assert run.rc == 0, run.output[-4000:]
    assert re.search(rf"{RELEASE}: 5 dists as expected, \d+ files match their RECORD hashes", flat(run.output)), run.output[-3000:]
    print(f"verify of the untouched release: {time.monotonic() - started:.1f} s")
    # ... then one line appended to an installed file, and a .pth (run at every start) added.
    site = f"{RELEASE}/lib/python3.11/site-packages"
    sh(node, f"echo 'import os' >> {site}/vllm/__init__.py && echo 'import os' > {site}/zz-evil.pth")
    run = ansible_playbook("playbooks/verify.yml", inventory, "--check")
    assert run.rc != 0 and "Traceback" not in run.output
    assert (f"{RELEASE} drifted from what was installed: (no dist): added lib/python3.11/site-packages/zz-evil.pth"
            f" | vllm: changed lib/python3.11/site-packages/vllm/__init__.py") in flat(run.output), run.output[-3000:]


def test_the_role_never_starts_a_releases_python_as_root(node, wheelhouse, tmp_path):
    """A .pth in site-packages runs at every start of the release's Python, the way a
    malicious wheel's would: here it records the uid. The role's probes (cuDNN, vllm
    --version) must all be vllm_fleet_probe_user's (nobody), never root's."""
    node, inventory = node
    copy_wheelhouse(node, wheelhouse)
    run, _ = run_role(inventory, tmp_path)
    assert run.rc == 0, run.output[-4000:]
    site = f"{RELEASE}/lib/python3.11/site-packages"
    sh(node, "install -m 0666 /dev/null /tmp/starts")
    sh(node, f"echo 'import os; open(\"/tmp/starts\", \"a\").write(str(os.getuid()) + chr(10))' > {site}/zz-who.pth")
    # Control: the hook records a start, here root's (once per site-packages path: lib and lib64).
    sh(node, f"{RELEASE}/bin/python -c pass")
    assert set(sh(node, "cat /tmp/starts").split()) == {"0"}
    sh(node, "truncate -s 0 /tmp/starts")

    run, _ = run_role(inventory, tmp_path)
    # The re-hash after the probes finds the .pth: drift, as it should.
    assert run.rc != 0 and "added lib/python3.11/site-packages/zz-who.pth" in flat(run.output), run.output[-3000:]
    starts = sh(node, "cat /tmp/starts").split()
    assert starts and set(starts) == {"65534"}, starts  # cudnn_facts' three probes and vllm --version: nobody


def test_missing_cudnn_fails_clearly_and_leaves_serving_alone(node, wheelhouse_without_new_cudnn, tmp_path):
    node, inventory = node
    copy_wheelhouse(node, wheelhouse_without_new_cudnn)
    # What serves now: an older release, `current` and `known-good` at it, a unit running it.
    old = f"{ROOT_DIR}/releases/vllm-0.25.0_nvidia-cudnn-cu13-9.19.0.56"
    sh(node, f"mkdir -p {old}/bin && echo '{{}}' > {old}/vllm-fleet-release.json"
             f" && ln -s releases/{Path(old).name} {ROOT_DIR}/current && ln -s releases/{Path(old).name} {ROOT_DIR}/known-good"
             " && systemd-run --unit vf-serving sleep 3600")
    snapshot = ("readlink /opt/vllm-fleet/current /opt/vllm-fleet/known-good;"
                f" find {old} -printf '%p %T@\\n' | sort;"
                " systemctl show -p MainPID -p ActiveEnterTimestampMonotonic -p NRestarts vf-serving")
    before = sh(node, snapshot)

    run, _ = run_role(inventory, tmp_path)

    assert run.rc != 0
    assert "Traceback" not in run.output
    expected = (f"release {RID}: cannot resolve vllm==0.25.1 with nvidia-cudnn-cu13==9.24.0.43 overridden "
                f"from the offline wheelhouse {WHEELHOUSE}: nvidia-cudnn-cu13==9.24.0.43 is not available there")
    assert expected in run.output
    assert recap(run.output)["failed"] == 1
    assert node.exec(f"test -e {RELEASE}").returncode != 0
    assert sh(node, f"ls -A {ROOT_DIR}/releases").split() == [Path(old).name]  # no staging left either
    assert sh(node, snapshot) == before
    assert sh(node, "systemctl is-active vf-serving").strip() == "active"


def compile_lock(wheelhouse: Path, tmp_path: Path) -> Path:
    """The lock of the planned release, compiled once here for the node's Python and platform."""
    (tmp_path / "requirements.in").write_text(f"vllm=={PLAN['vllm']}\n")
    (tmp_path / "overrides.txt").write_text(f"{PLAN['cudnn_package']}=={PLAN['cudnn']}\n")
    subprocess.run([str(Path(sys.executable).parent / "uv"), "--no-config", "pip", "compile", "--quiet",
                    "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_17",
                    "--no-index", "--find-links", str(wheelhouse), "--override", "overrides.txt",
                    "--generate-hashes", "--output-file", "lock.txt", "requirements.in"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=120)
    return tmp_path / "lock.txt"


def test_prune_keeps_n_and_never_current_or_known_good(node, wheelhouse, tmp_path):
    node, inventory = node
    copy_wheelhouse(node, wheelhouse)
    # This node installs a lock compiled on the controller (as a rollout would hand every
    # node the canary's), instead of resolving on its own.
    lock = compile_lock(wheelhouse, tmp_path)
    # Five older releases (r1 oldest), current -> r1, known-good -> r2; a stale staging
    # directory, and a directory that is not a release at all.
    setup = [f"mkdir -p {ROOT_DIR}/releases"]
    for i in range(1, 6):
        release = f"{ROOT_DIR}/releases/r{i}"
        setup.append(f"mkdir -p {release} && echo '{{}}' > {release}/vllm-fleet-release.json"
                     f" && touch -d '-{10 - i} hours' {release}/vllm-fleet-release.json")
    setup += [f"ln -s releases/r1 {ROOT_DIR}/current", f"ln -s releases/r2 {ROOT_DIR}/known-good",
              f"mkdir -p {ROOT_DIR}/releases/.staging-crashed/lib", f"mkdir -p {ROOT_DIR}/releases/notes"]
    sh(node, " && ".join(setup))

    run, _ = run_role(inventory, tmp_path, vllm_fleet_runtime_keep_releases=4, vllm_fleet_runtime_lock_src=str(lock))
    assert run.rc == 0, run.output[-6000:]
    assert sh(node, f"cat {RELEASE}/lock.txt") == lock.read_text()
    assert json.loads(sh(node, f"cat {RELEASE}/vllm-fleet-release.json"))["tools"]["lock"] == "given"

    # Kept: the new release, current's and known-good's, and the newest other one (r5).
    assert sorted(sh(node, f"ls -A {ROOT_DIR}/releases").split()) == sorted([RID, "r1", "r2", "r5", "notes"])
    assert sh(node, f"readlink {ROOT_DIR}/current {ROOT_DIR}/known-good").split() == ["releases/r1", "releases/r2"]

    # Keep 1 leaves only what must stay; a second run prunes nothing more.
    run, _ = run_role(inventory, tmp_path, vllm_fleet_runtime_keep_releases=1)
    assert run.rc == 0, run.output[-6000:]
    assert sorted(sh(node, f"ls -A {ROOT_DIR}/releases").split()) == sorted([RID, "r1", "r2", "notes"])
    run, _ = run_role(inventory, tmp_path, "--tags", "prune", vllm_fleet_runtime_keep_releases=1)
    assert run.rc == 0 and recap(run.output)["changed"] == 0, run.output[-4000:]


def tampered(wheel: Path, out_dir: Path) -> Path:
    """A copy of ``wheel`` under the same name, one file added: what a poisoned mirror serves."""
    import zipfile

    out_dir.mkdir(parents=True, exist_ok=True)
    copy = out_dir / wheel.name
    shutil.copyfile(wheel, copy)
    with zipfile.ZipFile(copy, "a") as archive:
        archive.writestr("evil.py", "import os\n")
    return copy


def test_tampered_wheels_are_refused_with_a_cold_cache(node, wheelhouse, tmp_path):
    node, inventory = node
    copy_wheelhouse(node, wheelhouse)
    # uv itself first: pip checks its wheel against the role's files/uv-requirements.txt.
    (uv_wheel,) = wheelhouse.glob("uv-*.whl")
    copy_wheelhouse(node, tampered(uv_wheel, tmp_path / "bad-uv").parent)
    run, _ = run_role(inventory, tmp_path)
    assert run.rc != 0 and "Traceback" not in run.output
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in run.output, run.output[-3000:]
    assert "Install uv into the tools venv, its wheel checked against the hashes" in run.output
    assert node.exec(f"test -e {ROOT_DIR}/tools/bin/uv").returncode != 0

    # Then vllm, against a lock compiled from the true wheelhouse (this node's uv cache is cold).
    lock = compile_lock(wheelhouse, tmp_path)
    (vllm_wheel,) = wheelhouse.glob("vllm-*.whl")
    copy_wheelhouse(node, wheelhouse)  # the true uv back
    copy_wheelhouse(node, tampered(vllm_wheel, tmp_path / "bad-vllm").parent)
    run, _ = run_role(inventory, tmp_path, vllm_fleet_runtime_lock_src=str(lock))
    assert run.rc != 0 and "Traceback" not in run.output
    assert (f'release {RID}: the step "Install exactly the lock, every file checked against its hash" failed') in run.output
    assert "Hash mismatch for `vllm==0.25.1`" in run.output, run.output[-3000:]
    assert sh(node, f"ls -A {ROOT_DIR}/releases") == ""  # no release, no staging left


def test_every_node_installs_the_first_nodes_lock(sim_nodes, wheelhouse, tmp_path):
    from tests.fixtures.wheels.build import build_wheel

    first, second = sim_nodes({"rt": None, "rt2": None})
    inventory = simnode.write_inventory([first, second], tmp_path / "inventory.yml")
    copy_wheelhouse(first, wheelhouse)
    copy_wheelhouse(second, wheelhouse)
    # rt2's wheelhouse also has a newer nvidia-ml-py (vllm requires it unpinned): resolving on
    # its own, rt2 would take it; the fleet installs what the first node resolved.
    newer = build_wheel("nvidia-ml-py", "13.999.0", {"pynvml.py": "NEWER = True\n"}, [], tmp_path / "newer")
    copy_wheelhouse(second, newer.parent)

    run, seconds = run_role(inventory, tmp_path)
    assert run.rc == 0, run.output[-6000:]
    print(f"\ntwo nodes, one lock: {seconds:.1f} s")
    manifests = {n.name: json.loads(sh(n, f"cat {RELEASE}/vllm-fleet-release.json")) for n in (first, second)}
    assert manifests[first.name]["tools"]["lock"] == "compiled here"
    assert manifests[second.name]["tools"]["lock"] == f"from {first.name}"
    assert sh(second, f"cat {RELEASE}/lock.txt") == sh(first, f"cat {RELEASE}/lock.txt")
    assert {p["name"]: p["version"] for p in manifests[second.name]["packages"]}["nvidia-ml-py"] == "13.615.71"
    assert "Re-hash the staged venv against the lock" in run.output
