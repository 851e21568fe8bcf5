"""The collection as a user gets it: `ansible-galaxy collection build` of this checkout,
installed into a scratch collections path, its playbooks run by name from a directory
outside the checkout against a simulated node. The tarball holds only what a user needs;
the catalogue and the profiles are found inside the installed copy; the reports land in
reports/ of the directory ansible-playbook runs from; nothing is written into the
collection."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.fixtures import story
from tests.fixtures.simnode import simnode

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CUDNN_BLOCKER = "cudnn-sm12x-fusion-matmul-oob"
BAD_CUDNN = {"vllm": "0.25.1", "torch": "2.11.0", "cudnn_package": "nvidia-cudnn-cu13", "cudnn": "9.19.0.56"}
EXIT0 = {"id": "vllm-api-server-exits-0-on-engine-death", "reason": "units use Restart=always"}
# Everything at the top of the tarball: the content and its docs (galaxy.yml's build_ignore).
SHIPPED = {"MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.md", "meta", "plugins", "roles",
           "playbooks", "catalogue", "profiles", "docs"}


def run(*cmd: str, cwd: Path, collections: Path) -> subprocess.CompletedProcess:
    """A command as a user of the installed collection runs it: no checkout config, only the
    scratch collections path (and the ansible bundle's collections in site-packages)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def tree_digest(top: Path) -> dict[str, str]:
    """Every path under top with its content's sha256 (directories and links by their kind)."""
    digest = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if path.is_symlink():
            digest[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            digest[rel] = "dir"
        else:
            digest[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(tarball members, the installed collection's directory, the scratch collections path)."""
    top = tmp_path_factory.mktemp("collection")
    build = run(str(BIN / "ansible-galaxy"), "collection", "build", str(ROOT), "--output-path", str(top / "dist"),
                cwd=top, collections=top / "scratch")
    assert build.returncode == 0, build.stdout + build.stderr
    tarball, = (top / "dist").glob("vllm_fleet-fleet-*.tar.gz")
    with tarfile.open(tarball) as tar:
        members = tar.getnames()
    install = run(str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(top / "scratch"),
                  "--no-deps", cwd=top, collections=top / "scratch")
    assert install.returncode == 0, install.stdout + install.stderr
    return members, top / "scratch" / "ansible_collections" / "vllm_fleet" / "fleet", top / "scratch"


def test_the_tarball_holds_what_a_user_needs_and_nothing_of_the_checkout(installed):
    members, _, _ = installed
    assert {m.split("/")[0] for m in members} == SHIPPED
    wanted = {"meta/runtime.yml", "catalogue/known_issues.yml", "catalogue/vllm_serve_args.yml",
              *(str(p.relative_to(ROOT)) for p in (ROOT / "playbooks").glob("*.yml")),
              *(str(p.relative_to(ROOT)) for p in (ROOT / "profiles").glob("*.yml")),
              *(str(p.relative_to(ROOT)) for p in (ROOT / "plugins").rglob("*.py") if "__pycache__" not in p.parts),
              *(str(p.relative_to(ROOT)) for p in (ROOT / "roles").glob("*/meta/*.yml"))}
    assert wanted - set(members) == set()
    assert not [m for m in members if "__pycache__" in m or m.endswith(".pyc")]


def test_installed_playbooks_run_by_name_write_reports_beside_the_operator_and_never_into_the_collection(
        installed, sim_nodes, tmp_path):
    _, collection, scratch = installed
    listing = run(str(BIN / "ansible-galaxy"), "collection", "list", "vllm_fleet.fleet", cwd=tmp_path,
                  collections=scratch)
    # The installed copy, not this checkout, is the one that runs.
    assert str(scratch) in listing.stdout and str(ROOT) not in listing.stdout, listing.stdout
    node, = sim_nodes({"sm120": "rtx_pro_6000"})
    work = tmp_path / "ops"
    work.mkdir()
    inventory = simnode.write_inventory([node], work / "inventory.yml")
    before = tree_digest(collection)

    def preflight(cwd: Path, **extra):
        return run(str(BIN / "ansible-playbook"), "-i", str(inventory), "vllm_fleet.fleet.preflight",
                   "-e", json.dumps({"vllm_fleet_release": BAD_CUDNN, "vllm_fleet_accepted_risks": [EXIT0], **extra}),
                   cwd=cwd, collections=scratch)

    # The catalogue inside the installed copy judged the plan (its cuDNN blocker), the default
    # profile resolved from it, and the report is in reports/ of the operator's directory.
    blocked = preflight(work)
    output = blocked.stdout + blocked.stderr
    assert blocked.returncode != 0, output
    assert "Traceback" not in output
    report = json.loads((work / "reports" / "preflight.json").read_text())
    assert report["sm120"]["report"]["verdict"] == "block"
    assert CUDNN_BLOCKER in {f["id"] for f in report["sm120"]["report"]["blockers"]}
    assert f"[{CUDNN_BLOCKER}]" in output
    assert tree_digest(collection) == before

    # Run from inside the installed collection, the default would land in it: refused,
    # naming the variable, and the tree is untouched.
    refused = preflight(collection)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "Traceback" not in output
    assert f"vllm_fleet_report_dir: {collection}/reports is inside the installed collection" in output, output[-3000:]
    assert tree_digest(collection) == before

    # Negative control of the digest: a report dir set inside the collection (what the old
    # role_path default did) is written there, and the digest sees it.
    inside = preflight(work, vllm_fleet_report_dir=str(collection / "reports"))
    assert (collection / "reports" / "preflight.json").is_file(), inside.stdout[-3000:]
    assert tree_digest(collection) != before
    shutil.rmtree(collection / "reports")


def test_the_installed_site_playbook_provisions_a_node_and_writes_nothing_into_the_collection(
        installed, sim_nodes, tmp_path):
    """Every role of site.yml (preflight, runtime, service with the collection's serve-args
    schema, watchdog with its module_utils) from the installed copy."""
    from tests.fixtures.wheels.build import build_node_wheelhouse

    _, collection, scratch = installed
    wheelhouse = build_node_wheelhouse(tmp_path / "wheelhouse")
    node, = sim_nodes({"node01": "rtx_pro_6000"}, volumes=(f"{wheelhouse}:/srv/wheelhouse:ro",))
    work = tmp_path / "ops"
    work.mkdir()
    port = simnode.free_port()
    inventory = simnode.write_inventory([node], work / "inventory.yml", all_vars={
        **story.FLEET_VARS, "vllm_fleet_instances": [{"name": "gpu0", "gpu": 0, "port": port}]})
    before = tree_digest(collection)

    site = run(str(BIN / "ansible-playbook"), "-i", str(inventory), "vllm_fleet.fleet.site", "-e", json.dumps({
        "vllm_fleet_release": story.FIXED, "vllm_fleet_profile": story.FP8, "vllm_fleet_accepted_risks": [EXIT0]}),
        cwd=work, collections=scratch)
    output = site.stdout + site.stderr
    assert site.returncode == 0, output[-5000:]
    assert json.loads((work / "reports" / "preflight.json").read_text())["node01"]["report"]["verdict"] != "block"
    served = subprocess.run(["podman", "exec", node.container, "readlink", "/opt/vllm-fleet/current"],
                            capture_output=True, text=True, timeout=60).stdout
    assert served.strip().endswith(story.FIXED_ID), served
    units = subprocess.run(["podman", "exec", node.container, "systemctl", "is-active", "vllm@gpu0",
                            "vllm-fleet-watchdog@gpu0.timer"], capture_output=True, text=True, timeout=60).stdout
    assert units.split() == ["active", "active"], units
    assert tree_digest(collection) == before
