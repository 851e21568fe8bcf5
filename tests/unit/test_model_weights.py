"""module_utils/model_weights.py and the model_weights module's run(), as plain Python.

Mirrors are a directory and a real HTTP server (http.server on 127.0.0.1) whose
SHA256SUMS the real ``sha256sum`` and ``stat -c '# size %s  %n'`` wrote; the Hub source runs the real huggingface_hub
client against tests/fixtures/hub_endpoint.py, a composed local stand-in for the Hub API.
"""
import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.model_weights import (
    MARKER,
    FileSpec,
    HubSource,
    MirrorSource,
    WeightsError,
    check,
    check_model,
    copy_capped,
    parse_sums,
    prune,
    read_token,
    stage,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils import model_weights
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import dump_config, model_path
from ansible_collections.vllm_fleet.fleet.plugins.modules.model_weights import ARGUMENT_SPEC, run
from tests.fixtures.hub_endpoint import FakeHub, git_blob_sha1

try:  # a test dependency (pyproject); the Hub source's tests need it, the rest do not
    import huggingface_hub.constants as HF_CONSTANTS
except ImportError:  # pragma: no cover
    HF_CONSTANTS = None

ROOT = Path(__file__).resolve().parents[2]
SHARD = "model-00001-of-00002.safetensors"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_TestTokenValue0123456789"
AS_ROOT = os.geteuid() == 0
needs_hub = pytest.mark.skipif(HF_CONSTANTS is None, reason="huggingface_hub (a test dependency) is not installed")


# --- helpers -------------------------------------------------------------------------------


def make_model(mirror, name="m", revision="r1", *, binary=False, shard_bytes=1 << 20, sizes=True) -> dict:
    """``<mirror>/<name>/<revision>/`` with a few files and SHA256SUMS by the real sha256sum,
    each file's size appended by the real stat, as roles/vllm_model/README.md tells operators."""
    rev = mirror / name / revision
    files = {
        "config.json": b'{"architectures": ["Qwen3MoeForCausalLM"]}\n',
        SHARD: os.urandom(shard_bytes),
        "model-00002-of-00002.safetensors": os.urandom(4096),
        "sub/x.json": b'{"x": 1}\n',
    }
    for rel, data in files.items():
        (rev / rel).parent.mkdir(parents=True, exist_ok=True)
        (rev / rel).write_bytes(data)
    argv = ["sha256sum", *(["-b"] if binary else []), "config.json",
            SHARD, "model-00002-of-00002.safetensors", "sub/x.json"]
    sums = subprocess.run(argv, cwd=rev, check=True, capture_output=True).stdout
    if sizes:
        sums += subprocess.run(["stat", "-c", "# size %s  %n", *argv[-4:]], cwd=rev, check=True,
                               capture_output=True).stdout
    (rev / "SHA256SUMS").write_bytes(sums)
    return files


def listing(path) -> list:
    return sorted(os.listdir(path))


def assert_nothing_left(models_dir):
    """No model directory, no .staging- (nor anything else) after a failed or dry stage."""
    assert listing(models_dir) == []


def params(**values) -> dict:
    """The module's parameters as AnsibleModule would fill them (reserve_gib 0 here)."""
    filled = {key: spec.get("default") for key, spec in ARGUMENT_SPEC.items()}
    filled.update(reserve_gib=0)
    filled.update(values)
    return filled


@contextmanager
def serving(handler_class):
    """A ThreadingHTTPServer on 127.0.0.1 with handler_class; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def http_mirror(root, *, credentials=None):
    """SimpleHTTPRequestHandler serving root on 127.0.0.1; yields (url, requests seen).
    With credentials ("user:pass") it answers 401 unless the Basic header carries them."""
    seen = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

        def _allowed(self):
            seen.append((self.command, self.path, self.headers.get("Authorization")))
            if credentials and self.headers.get("Authorization") != (
                    "Basic " + base64.b64encode(credentials.encode()).decode()):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="models"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False
            return True

        def do_GET(self):
            if self._allowed():
                super().do_GET()

        def do_HEAD(self):
            if self._allowed():
                super().do_HEAD()

    with serving(Handler) as url:
        yield url, seen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def models_dir(tmp_path):
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def mirror(tmp_path):
    path = tmp_path / "mirror"
    path.mkdir()
    return path


def assert_staged(models_dir, name, revision, files):
    final = models_dir / f"{name}@{revision}"
    for rel, data in files.items():
        assert (final / rel).read_bytes() == data, rel
    marker = json.loads((final / MARKER).read_text())
    assert marker["name"] == name and marker["revision"] == revision
    assert marker["files"] == {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                               for rel, data in files.items()}
    assert listing(models_dir) == [f"{name}@{revision}"]  # no .staging- left
    return marker


# --- SHA256SUMS as the real tool writes it -------------------------------------------------


@pytest.mark.parametrize("binary, separator", [(False, "  "), (True, " *")])
def test_parse_sums_reads_the_real_sha256sum_output(mirror, binary, separator):
    files = make_model(mirror, binary=binary)
    text = (mirror / "m" / "r1" / "SHA256SUMS").read_text()
    lines = text.splitlines()
    assert all(line[64:66] == separator for line in lines[:4])  # the tool's own format
    assert lines[4:] == [f"# size {len(files[rel])}  {rel}" for rel in
                         ["config.json", SHARD, "model-00002-of-00002.safetensors", "sub/x.json"]]
    assert parse_sums(text, "SHA256SUMS") == {
        rel: FileSpec(rel, len(data), sha256=hashlib.sha256(data).hexdigest()) for rel, data in files.items()}
    # The size lines are comments to sha256sum: the file still checks, in --strict mode too.
    checked = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=mirror / "m" / "r1",
                             capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 4, checked.stdout + checked.stderr


@pytest.mark.parametrize("line, words", [
    (f"{'a' * 64}  ../etc/passwd", ["../etc/passwd", "not a plain relative path"]),
    (f"{'a' * 64}  /etc/passwd", ["/etc/passwd", "not a plain relative path"]),
    (f"{'a' * 64}  sub//x.json", ["sub//x.json", "not a plain relative path"]),
    (f"{'a' * 63}  config.json", ["line 2", "not a sha256sum line"]),
    ("config.json  " + "a" * 64, ["line 2", "not a sha256sum line"]),
])
def test_parse_sums_refuses_escaping_and_malformed_lines(line, words):
    with pytest.raises(WeightsError) as err:
        parse_sums(f"{'b' * 64}  ok.json\n{line}\n", "SHA256SUMS")
    for word in words:
        assert word in str(err.value)


def test_parse_sums_refuses_a_file_listed_twice_and_an_empty_list():
    with pytest.raises(WeightsError, match="listed twice"):
        parse_sums(f"{'a' * 64}  x\n{'b' * 64} *x\n", "S")
    with pytest.raises(WeightsError, match="lists no file"):
        parse_sums("\n\n", "S")


# --- the mirror as a directory -------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True])
def test_stage_from_a_directory_mirror_then_idempotent(models_dir, mirror, binary):
    files = make_model(mirror, binary=binary)
    result = stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"), now=lambda: 1234.5)
    assert result == {"changed": True, "path": str(models_dir / "m@r1"), "files": 4,
                      "bytes": sum(map(len, files.values())), "source": str(mirror / "m" / "r1")}
    marker = assert_staged(models_dir, "m", "r1", files)
    assert marker["staged_at"] == 1234.5 and marker["source"] == str(mirror / "m" / "r1")
    assert "SHA256SUMS" not in marker["files"]

    shutil.rmtree(mirror)  # the source is gone: a second stage must not need it
    again = stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert again == {**result, "changed": False}
    verified = check(str(models_dir), "m", "r1", rehash=True)
    assert verified["verified"] is True and verified["problems"] == []
    assert (verified["files"], verified["bytes"]) == (4, result["bytes"])


def test_a_relative_mirror_is_refused():
    with pytest.raises(WeightsError, match="neither an absolute directory"):
        MirrorSource("models/mirror", "m", "r1")


# --- the mirror over HTTP ------------------------------------------------------------------


def test_stage_from_an_http_mirror_then_idempotent(models_dir, mirror):
    files = make_model(mirror)
    with http_mirror(mirror) as (url, seen):
        source = MirrorSource(url, "m", "r1", timeout=10, allow_http=True)
        result = stage(str(models_dir), "m", "r1", source)
        assert result["changed"] is True and result["files"] == 4
        assert result["source"] == f"{url}/m/r1"
        gets = sorted(path for method, path, _ in seen if method == "GET")
        assert gets == sorted(f"/m/r1/{rel}" for rel in [*files, "SHA256SUMS"])
        assert_staged(models_dir, "m", "r1", files)

        seen.clear()
        again = stage(str(models_dir), "m", "r1", MirrorSource(url, "m", "r1", timeout=10, allow_http=True))
        assert again == {**result, "changed": False}
        assert seen == []  # nothing downloaded, not even SHA256SUMS
    assert check(str(models_dir), "m", "r1", rehash=True)["verified"] is True


def test_http_mirror_credentials_go_in_a_header_and_nowhere_else(models_dir, mirror):
    files = make_model(mirror, shard_bytes=4096)
    with http_mirror(mirror, credentials="fleet:secret") as (url, seen):
        with_credentials = url.replace("http://", "http://fleet:secret@")
        result = run(params(models_dir=str(models_dir), name="m", revision="r1", mirror=with_credentials,
                            allow_http=True), check_mode=False)
        expected = "Basic " + base64.b64encode(b"fleet:secret").decode()
        assert seen and all(header == expected for _, _, header in seen)
    assert result["changed"] is True and result["model"]["source"] == f"{url}/m/r1"
    assert "secret" not in json.dumps(result)
    assert "secret" not in (models_dir / "m@r1" / MARKER).read_text()
    assert_staged(models_dir, "m", "r1", files)


def test_http_mirror_without_the_credentials_it_wants_is_a_clear_401(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    with http_mirror(mirror, credentials="fleet:secret") as (url, _):
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", "r1", MirrorSource(url, "m", "r1", timeout=10, allow_http=True))
    assert "401" in str(err.value) and "SHA256SUMS" in str(err.value)
    assert_nothing_left(models_dir)


def test_check_mode_downloads_nothing_and_creates_nothing(models_dir, mirror):
    files = make_model(mirror)
    with http_mirror(mirror) as (url, seen):
        result = stage(str(models_dir), "m", "r1", MirrorSource(url, "m", "r1", timeout=10, allow_http=True), check_mode=True)
        assert [path for method, path, _ in seen if method == "GET"] == ["/m/r1/SHA256SUMS"]
    assert result == {"changed": True, "path": str(models_dir / "m@r1"), "files": 4,
                      "bytes": sum(map(len, files.values())), "source": f"{url}/m/r1"}
    assert_nothing_left(models_dir)
    # The module's run() in check mode: the same, from the directory mirror.
    dry = run(params(models_dir=str(models_dir), name="m", revision="r1", mirror=str(mirror)), check_mode=True)
    assert dry["changed"] is True and dry["model"]["files"] == 4
    assert_nothing_left(models_dir)


# --- negative controls: the message names the problem, nothing is left --------------------


def test_a_file_that_does_not_match_its_sum_is_refused(models_dir, mirror):
    files = make_model(mirror)
    corrupt = bytearray(files[SHARD])
    corrupt[1000] ^= 0xFF
    (mirror / "m" / "r1" / SHARD).write_bytes(bytes(corrupt))
    with http_mirror(mirror) as (url, _):
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", "r1", MirrorSource(url, "m", "r1", timeout=10, allow_http=True))
    message = str(err.value)
    assert SHARD in message
    assert hashlib.sha256(files[SHARD]).hexdigest() in message  # what SHA256SUMS says
    assert hashlib.sha256(bytes(corrupt)).hexdigest() in message  # what came
    assert_nothing_left(models_dir)


def test_a_file_of_another_size_than_served_is_refused(models_dir, mirror):
    make_model(mirror)
    (mirror / "m" / "r1" / "sub" / "x.json").write_bytes(b'{"x": 22}\n')  # after sha256sum ran
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert str(err.value) == (f"sub/x.json from {mirror}/m/r1: more than the 9 bytes SHA256SUMS declares:"
                              " the download was stopped there and removed")
    assert_nothing_left(models_dir)
    (mirror / "m" / "r1" / "sub" / "x.json").write_bytes(b'{"x":1}\n')  # shorter
    with pytest.raises(WeightsError, match="sub/x.json from .*: 8 bytes, SHA256SUMS declares 9"):
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert_nothing_left(models_dir)


def test_a_revision_the_mirror_does_not_have(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    with http_mirror(mirror) as (url, _):
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", "r2", MirrorSource(url, "m", "r2", timeout=10, allow_http=True))
    assert "404" in str(err.value) and f"{url}/m/r2/SHA256SUMS" in str(err.value)
    assert_nothing_left(models_dir)


def test_a_file_listed_but_absent_from_a_directory_mirror(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    (mirror / "m" / "r1" / "sub" / "x.json").unlink()
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert str(err.value) == (f"cannot read {mirror}/m/r1/sub/x.json from the mirror: No such file or directory")
    assert_nothing_left(models_dir)


def test_an_unreachable_mirror(models_dir):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(url, "m", "r1", timeout=5, allow_http=True))
    assert "cannot read" in str(err.value) and f"{url}/m/r1/SHA256SUMS" in str(err.value)
    assert "refused" in str(err.value).lower()
    assert_nothing_left(models_dir)


def test_a_reserve_larger_than_the_disk(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"), reserve_bytes=10**18)
    message = str(err.value)
    assert "GiB free" in message and "vllm_fleet_model_reserve_gib" in message and str(models_dir) in message
    assert_nothing_left(models_dir)


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd"])
def test_a_sums_line_that_escapes_the_model(models_dir, mirror, bad):
    make_model(mirror, shard_bytes=16)
    sums = mirror / "m" / "r1" / "SHA256SUMS"
    sums.write_text(sums.read_text() + f"{hashlib.sha256(b'root').hexdigest()}  {bad}\n")
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert bad in str(err.value) and "line 9" in str(err.value)
    assert_nothing_left(models_dir)
    assert not (models_dir.parent / "etc").exists()


def test_a_malformed_sums_line(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    sums = mirror / "m" / "r1" / "SHA256SUMS"
    sums.write_text("garbage line without a hash\n" + sums.read_text())
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert "line 1" in str(err.value) and "not a sha256sum line" in str(err.value)
    assert_nothing_left(models_dir)


# --- check() and a model that broke after staging ------------------------------------------


def test_check_finds_a_truncated_file_and_stage_refuses_to_paper_over_it(models_dir, mirror):
    files = make_model(mirror)
    stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    with open(models_dir / "m@r1" / SHARD, "r+b") as handle:
        handle.truncate(100)
    found = check(str(models_dir), "m", "r1")
    assert found["present"] is True and found["verified"] is False
    assert found["problems"] == [f"{SHARD} is 100 bytes, staged as {len(files[SHARD])}"]

    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert "no longer complete" in str(err.value) and SHARD in str(err.value)
    assert f"remove {models_dir / 'm@r1'}" in str(err.value)
    assert (models_dir / "m@r1" / SHARD).stat().st_size == 100  # left as it was, for a person to see

    with pytest.raises(WeightsError, match="not ready"):
        run(params(models_dir=str(models_dir), name="m", revision="r1", state="verified"), check_mode=False)


def test_check_with_rehash_finds_same_size_corruption(models_dir, mirror):
    make_model(mirror, shard_bytes=4096)
    stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    path = models_dir / "m@r1" / "sub" / "x.json"
    path.write_bytes(path.read_bytes().replace(b"1", b"2"))
    assert check(str(models_dir), "m", "r1")["verified"] is True  # sizes only
    rehashed = check(str(models_dir), "m", "r1", rehash=True)
    assert rehashed["verified"] is False
    assert rehashed["problems"] == ["sub/x.json no longer has the sha256 it was staged with"]


def test_check_of_a_file_removed_after_staging(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    (models_dir / "m@r1" / "config.json").unlink()
    assert check(str(models_dir), "m", "r1")["problems"] == ["config.json is missing"]


def test_verified_through_the_module_for_a_model_never_staged(models_dir):
    with pytest.raises(WeightsError) as err:
        run(params(models_dir=str(models_dir), name="m", revision="r1", state="verified"), check_mode=False)
    assert "the model m@r1 is not ready" in str(err.value) and "not staged" in str(err.value)
    assert_nothing_left(models_dir)


def test_verified_through_the_module_for_a_staged_model(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    result = run(params(models_dir=str(models_dir), name="m", revision="r1", state="verified", rehash=True),
                 check_mode=False)
    assert result["changed"] is False and result["model"]["verified"] is True


def test_the_module_without_a_source(models_dir):
    with pytest.raises(WeightsError, match="has no source"):
        run(params(models_dir=str(models_dir), name="m", revision="r1"), check_mode=False)


# --- prune() -------------------------------------------------------------------------------


def staged_models(models_dir, mirror, *dirnames):
    for dirname in dirnames:
        name, revision = dirname.split("@")
        make_model(mirror, name, revision, shard_bytes=64)
        stage(str(models_dir), name, revision, MirrorSource(str(mirror), name, revision))
        assert check(str(models_dir), name, revision)["verified"]


def test_prune_keeps_the_named_and_the_protected(tmp_path, models_dir, mirror):
    staged_models(models_dir, mirror, "a@1", "a@10", "b@2", "c@3")
    (models_dir / ".staging-x@y" / "sub").mkdir(parents=True)
    (models_dir / "notes.txt").write_text("not a model\n")
    (models_dir / "lost+found").mkdir()
    config = tmp_path / "config"
    config.mkdir()
    (config / "gpu0.yaml").write_text(dump_config({"model": str(models_dir / "a@1"), "port": 8000},
                                                  header="written by the role"))
    assert f'model: "{models_dir}/a@1"' in (config / "gpu0.yaml").read_text()
    protect = [str(models_dir / "b@2")]
    expected = {"kept": ["a@1", "b@2"], "removed": [".staging-x@y", "a@10", "c@3"],
                "ignored": ["lost+found", "notes.txt"]}
    before = listing(models_dir)

    dry = run(params(models_dir=str(models_dir), state="pruned", protect=protect,
                     config_dirs=[str(config), str(tmp_path / "absent")]), check_mode=True)
    assert dry == {"changed": True, "prune": expected}
    assert listing(models_dir) == before

    assert prune(str(models_dir), protect, [str(config)]) == {"changed": True, **expected}
    assert listing(models_dir) == ["a@1", "b@2", "lost+found", "notes.txt"]
    assert check(str(models_dir), "a", "1", rehash=True)["verified"]
    assert check(str(models_dir), "b", "2", rehash=True)["verified"]

    again = prune(str(models_dir), protect, [str(config)])
    assert again["changed"] is False and again["removed"] == []


def test_prune_a_path_does_not_protect_a_longer_one_it_prefixes(tmp_path, models_dir, mirror):
    staged_models(models_dir, mirror, "a@1", "a@10")
    config = tmp_path / "config"
    config.mkdir()
    (config / "gpu1.yaml").write_text(dump_config({"model": str(models_dir / "a@10")}))
    result = prune(str(models_dir), [], [str(config)])
    assert (result["kept"], result["removed"]) == (["a@10"], ["a@1"])
    assert listing(models_dir) == ["a@10"]
    # and the other way round, through protect
    staged_models(models_dir, mirror, "a@1")
    result = prune(str(models_dir), [str(models_dir / "a@1")], [])
    assert (result["kept"], result["removed"]) == (["a@1"], ["a@10"])


def test_prune_keeps_what_model_path_names_with_a_trailing_slash_on_models_dir(tmp_path, models_dir, mirror):
    """The role protects ``model_path(profile, models_dir)`` and configurations hold it: a
    models_dir given as ``.../models/`` must still match prune's own paths."""
    staged_models(models_dir, mirror, "a@1", "b@2")
    slashed = str(models_dir) + "/"
    served = model_path({"weights": {"name": "a", "revision": "1"}}, slashed)
    config = tmp_path / "config"
    config.mkdir()
    (config / "gpu0.yaml").write_text(dump_config({"model": served}))
    result = prune(slashed, [served], [str(config)])
    assert (result["kept"], result["removed"]) == (["a@1"], ["b@2"])


def test_prune_of_a_missing_models_dir(tmp_path):
    assert prune(str(tmp_path / "nothing"), [], []) == {"changed": False, "kept": [], "removed": [], "ignored": []}


# --- read_token() --------------------------------------------------------------------------


def token_file(tmp_path, text, mode):
    path = tmp_path / "hf-token"
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660], ids=lambda mode: f"{mode:04o}")
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    path = token_file(tmp_path, TOKEN + "\n", mode)
    with pytest.raises(WeightsError) as err:
        read_token(path)
    message = str(err.value)
    assert f"mode {mode:04o}" in message and f"chmod 0600 {path}" in message
    assert TOKEN not in message


@pytest.mark.skipif(not AS_ROOT, reason="a token file must be owned by root: the tests run as root here")
@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_root_only_token_file_is_read_stripped(tmp_path, mode):
    assert read_token(token_file(tmp_path, f"  {TOKEN}\n\n", mode)) == TOKEN


@pytest.mark.skipif(AS_ROOT, reason="as root the file is owned by root")
def test_a_token_file_not_owned_by_root_is_refused(tmp_path):
    with pytest.raises(WeightsError) as err:
        read_token(token_file(tmp_path, TOKEN, 0o600))
    assert f"is owned by uid {os.geteuid()}, not by root" in str(err.value) and TOKEN not in str(err.value)


@pytest.mark.parametrize("text", [f"{TOKEN}\nhf_second_token_value\n", f"{TOKEN} hf_second_token_value", "\n  \n"])
def test_a_token_file_must_hold_one_token(tmp_path, text):
    path = token_file(tmp_path, text, 0o600)
    with pytest.raises(WeightsError) as err:
        read_token(path)
    assert TOKEN not in str(err.value) and "hf_second_token_value" not in str(err.value)
    if AS_ROOT:
        assert ("must hold one token" if text.strip() else "is empty") in str(err.value)


def test_a_missing_token_file(tmp_path):
    with pytest.raises(WeightsError, match="cannot be read: No such file"):
        read_token(str(tmp_path / "absent"))


# --- check_model() -------------------------------------------------------------------------


def test_check_model_returns_a_good_map():
    assert check_model({"name": "qwen3.6-35b-a3b-nvfp4", "revision": "2026-11-30"}) == {
        "name": "qwen3.6-35b-a3b-nvfp4", "revision": "2026-11-30"}
    hub = {"name": "m", "revision": COMMIT, "hub_repo": "org/Model-1.5"}
    assert check_model(hub) == hub
    assert check_model({"name": "m", "revision": "r1", "hub_repo": None}) == {"name": "m", "revision": "r1"}


@pytest.mark.parametrize("weights, words", [
    ({"name": "m", "revision": "main", "hub_repo": "org/m"}, ["'main'", "40-hex commit"]),
    ({"name": "m", "revision": COMMIT.upper(), "hub_repo": "org/m"}, ["40-hex commit"]),
    ({"name": "m"}, ["profile.weights.revision", "is required"]),
    ({"name": "m", "hub_repo": "org/m"}, ["profile.weights.revision", "40-hex commit"]),
    ({"name": "m", "revision": "r1", "sha": "x", "Revision": "y"},
     ["unknown key(s) Revision, sha", "allowed: name, revision, hub_repo"]),
    ({"name": "../m", "revision": "r1"}, ["profile.weights.name", "not a directory name"]),
    ({"name": "m", "revision": "../r1"}, ["profile.weights.revision"]),
    ({"name": "m", "revision": COMMIT, "hub_repo": "just-a-name"}, ["hub_repo", "owner/name"]),
    ("m@r1", ["not a mapping"]),
])
def test_check_model_refuses(weights, words):
    with pytest.raises(WeightsError) as err:
        check_model(weights)
    for word in words:
        assert word in str(err.value)


# --- the Hub, through the real huggingface_hub client and a local stand-in -----------------


HUB_FILES = {
    "config.json": b'{"architectures": ["Qwen3MoeForCausalLM"]}\n',
    SHARD: os.urandom(1 << 20),
    "sub/tokenizer.json": b'{"version": "1.0"}\n',
}
LFS = {SHARD}


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch):
    """huggingface_hub's own cache (it may copy a cached file) in tmp, never the machine's."""
    if HF_CONSTANTS is not None:
        monkeypatch.setattr(HF_CONSTANTS, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@needs_hub
def test_the_stand_in_lists_what_the_client_reads():
    from huggingface_hub import HfApi

    with FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS) as hub:
        info = HfApi(endpoint=hub.url, token=False).model_info("org/m", revision=COMMIT, files_metadata=True)
    siblings = {sibling.rfilename: sibling for sibling in info.siblings}
    assert siblings["config.json"].blob_id == git_blob_sha1(HUB_FILES["config.json"])
    assert siblings["config.json"].lfs is None
    assert siblings[SHARD].lfs.sha256 == hashlib.sha256(HUB_FILES[SHARD]).hexdigest()
    assert siblings[SHARD].lfs.size == len(HUB_FILES[SHARD])
    # git's blob id, as `git hash-object` computes it
    assert git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


@needs_hub
@pytest.mark.skipif(not AS_ROOT, reason="the token file must be owned by root")
def test_stage_from_the_hub_with_a_token(tmp_path, models_dir):
    path = token_file(tmp_path, TOKEN + "\n", 0o600)
    with FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS, token=TOKEN) as hub:
        result = run(params(models_dir=str(models_dir), name="m", revision=COMMIT, hub_repo="org/m",
                            hub_endpoint=hub.url, hub_token_file=path, allow_http=True), check_mode=False)
        assert hub.requests and all(headers.get("Authorization") == f"Bearer {TOKEN}"
                                    for _, _, headers in hub.requests)
        downloaded = sorted(p for method, p, _ in hub.requests if method == "GET" and "/resolve/" in p)
        assert downloaded == sorted(f"/org/m/resolve/{COMMIT}/{rel}" for rel in HUB_FILES)

        hub.requests.clear()
        again = run(params(models_dir=str(models_dir), name="m", revision=COMMIT, hub_repo="org/m",
                           hub_endpoint=hub.url, hub_token_file=path, allow_http=True), check_mode=False)
        assert again == {**result, "changed": False} and hub.requests == []
    assert result["changed"] is True
    assert result["model"] == {"path": str(models_dir / f"m@{COMMIT}"), "files": 3,
                               "bytes": sum(map(len, HUB_FILES.values())),
                               "source": f"{hub.url}/org/m@{COMMIT}"}
    assert TOKEN not in json.dumps(result)
    assert TOKEN not in (models_dir / f"m@{COMMIT}" / MARKER).read_text()
    assert_staged(models_dir, "m", COMMIT, HUB_FILES)
    # the client's download folders (.hub-*, .cache/huggingface) are gone
    leftovers = [os.path.join(root, entry) for root, dirs, names in os.walk(models_dir)
                 for entry in dirs + names if entry.startswith(".")]
    assert leftovers == []
    assert check(str(models_dir), "m", COMMIT, rehash=True)["verified"] is True


@needs_hub
def test_a_private_hub_repo_without_the_token(models_dir):
    with FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS, token=TOKEN) as hub:
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", COMMIT, HubSource("org/m", COMMIT, endpoint=hub.url, allow_http=True))
        assert all("Authorization" not in headers for _, _, headers in hub.requests)
    assert "the Hub refused" in str(err.value) and "401" in str(err.value)
    assert_nothing_left(models_dir)


@pytest.mark.parametrize("bad, words", [
    (SHARD, ["sha256", hashlib.sha256(HUB_FILES[SHARD]).hexdigest()]),  # LFS: by its sha256
    ("config.json", ["git blob", git_blob_sha1(HUB_FILES["config.json"])]),  # git file: by its blob id
])
@needs_hub
def test_the_hub_serving_other_bytes_than_it_lists(models_dir, bad, words):
    other = bytes(reversed(HUB_FILES[bad]))
    assert len(other) == len(HUB_FILES[bad]) and other != HUB_FILES[bad]
    with FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS, serve={bad: other}) as hub:
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", COMMIT, HubSource("org/m", COMMIT, endpoint=hub.url, allow_http=True))
    assert str(err.value).startswith(f"{bad} from {hub.url}/org/m@{COMMIT}")
    for word in words:
        assert word in str(err.value)
    assert_nothing_left(models_dir)


@needs_hub
@pytest.mark.parametrize("repo, revision, status", [("org/missing", COMMIT, "404"), ("org/m", "f" * 40, "404")])
def test_a_hub_repo_or_commit_that_does_not_exist(models_dir, repo, revision, status):
    with FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS) as hub:
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", revision, HubSource(repo, revision, endpoint=hub.url, allow_http=True))
    assert "the Hub refused" in str(err.value) and f"{repo}@{revision}" in str(err.value)
    assert status in str(err.value)
    assert_nothing_left(models_dir)


@needs_hub
def test_an_unreachable_hub(models_dir):
    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", COMMIT, HubSource("org/m", COMMIT, endpoint=endpoint, allow_http=True))
    assert "cannot reach the Hub" in str(err.value) and f"{endpoint}/org/m@{COMMIT}" in str(err.value)
    assert_nothing_left(models_dir)


@needs_hub
def test_a_hub_file_that_vanished_after_the_listing(models_dir, monkeypatch):
    """The listing names a file the resolve endpoint no longer has (a 404 on download)."""
    with FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS) as hub:
        listing_ = hub.info()
        monkeypatch.setattr(hub, "info", lambda: listing_)
        hub.files = {rel: data for rel, data in HUB_FILES.items() if rel != "sub/tokenizer.json"}
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", COMMIT, HubSource("org/m", COMMIT, endpoint=hub.url, allow_http=True))
    assert "sub/tokenizer.json" in str(err.value) and "404" in str(err.value)
    assert_nothing_left(models_dir)


# --- credentials at -vvv, through ansible-runner (issue 32, item 5) --------------------------

SECRET = "s3cr3t-Mirror-Pass"
VVV_PLAY = """- hosts: all
  gather_facts: false
  tasks:
    - name: Stage through the role
      ansible.builtin.import_role:
        name: vllm_fleet.fleet.vllm_model
    - name: A revision the mirror does not have, through the role
      block:
        - name: Stage a missing revision
          ansible.builtin.import_role:
            name: vllm_fleet.fleet.vllm_model
          vars:
            vllm_fleet_profile: {weights: {name: m, revision: r9}}
      rescue:
        - name: Note the refusal
          ansible.builtin.set_fact:
            refused: "{{ ansible_failed_result.msg }}"
    - name: Stage from the Hub with a token, through the role
      ansible.builtin.import_role:
        name: vllm_fleet.fleet.vllm_model
      vars:
        vllm_fleet_profile: {weights: {name: h, revision: "COMMIT", hub_repo: org/m}}
        vllm_fleet_model_hub_endpoint: "{{ hub_url }}"
        vllm_fleet_model_hub_token_file: "{{ hub_token_path }}"
        vllm_fleet_model_prune: false
      when: hub_url is defined

- hosts: all
  gather_facts: false
  tasks:
    - name: CONTROL the old path - the URL with its credentials as a module argument
      vllm_fleet.fleet.model_weights:
        models_dir: "{{ vllm_fleet_models_dir }}"
        name: m
        revision: r1
        mirror: "{{ vllm_fleet_model_mirror }}"
        timeout: not-a-number
      ignore_errors: true
"""


def test_mirror_credentials_reach_no_output_at_vvv_nor_any_job_event(tmp_path, models_dir, mirror, monkeypatch):
    """The role at -vvv through the product's own ansible-runner call: the password is in no
    line of the output and no job event, the staging succeeded with it and a failure's message
    names the URL without it; so for the Hub's token (as root, where the token file can be
    root's). The last task is the negative control: the module given the URL
    whole and failing its argument check echoes its arguments, password included, as the old
    role's task did in every result - the search finds it there, so it can fail."""
    import vllm_fleet.runner as runner

    make_model(mirror, shard_bytes=4096)
    (tmp_path / "play.yml").write_text(VVV_PLAY.replace("COMMIT", COMMIT))
    hub_vars = {}
    if AS_ROOT and HF_CONSTANTS is not None:
        hub = FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS, token=TOKEN).__enter__()
        hub_vars = {"hub_url": hub.url, "hub_token_path": token_file(tmp_path, TOKEN + "\n", 0o600)}
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    (tmp_path / "hosts.yml").write_text(f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
                                        f"      ansible_python_interpreter: {sys.executable}\n"
                                        "      vllm_fleet_profile: {weights: {name: m, revision: r1}}\n")
    plain_kwargs = runner.runner_kwargs
    monkeypatch.setattr(runner, "runner_kwargs", lambda *a: {**plain_kwargs(*a), "verbosity": 3})
    events = []
    with http_mirror(mirror, credentials=f"fleet:{SECRET}") as (url, seen):
        extravars = {"vllm_fleet_model_mirror": url.replace("http://", f"http://fleet:{SECRET}@"),
                     "vllm_fleet_model_allow_http": True, "vllm_fleet_model_reserve_gib": 0,
                     "vllm_fleet_models_dir": str(models_dir), "vllm_fleet_config_dir": str(tmp_path / "etc"),
                     **hub_vars}
        try:
            result = runner.run(runner.RunRequest(
                project_dir=ROOT, playbook=tmp_path / "play.yml", inventories=[tmp_path / "hosts.yml"],
                private_data_dir=tmp_path / "run", ident="vvv", extravars=extravars), on_event=events.append)
        finally:
            if hub_vars:
                hub.__exit__(None, None, None)
    stdout = (result.artifact_dir / "stdout").read_text()
    assert result.rc == 0, stdout[-3000:]
    assert "ESTABLISH LOCAL CONNECTION" in stdout  # -vvv
    assert check(str(models_dir), "m", "r1", rehash=True)["verified"] is True
    assert {header for _, _, header in seen if header} == {"Basic " + base64.b64encode(f"fleet:{SECRET}".encode()).decode()}
    refused = [e for e in events if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Note the refusal"]
    assert refused and f"the mirror answered 404 File not found for {url}/m/r9/SHA256SUMS" in json.dumps(refused)
    if hub_vars:
        assert check(str(models_dir), "h", COMMIT, rehash=True)["verified"] is True
        assert hub.requests and all(headers.get("Authorization") == f"Bearer {TOKEN}" for _, _, headers in hub.requests)
        assert TOKEN not in stdout and all(TOKEN not in json.dumps(e) for e in events)

    control = [e for e in events if "CONTROL" in json.dumps(e.get("event_data", {}).get("task", ""))]
    assert SECRET in json.dumps(control)  # negative control: the search finds a leak
    others = [e for e in events if e not in control]
    assert len(others) > 10 and all(SECRET not in json.dumps(e) for e in others)
    before_control = stdout.split("TASK [CONTROL")[0]
    assert "TASK [vllm_fleet.fleet.vllm_model : Stage the profile" in before_control and SECRET not in before_control
    assert SECRET in stdout.split("TASK [CONTROL")[1]
    for path in (tmp_path / "run").rglob("*"):  # every artifact but the control's events
        if path.is_file() and path.name != "stdout" and "CONTROL" not in path.read_text(errors="replace"):
            assert SECRET not in path.read_text(errors="replace"), path


# --- a hostile HTTP mirror (issue 32, item 5) -------------------------------------------------


@contextmanager
def scripted_server(answer):
    """An HTTP server on 127.0.0.1 whose handler is answer(handler); yields (url, requests seen)
    as (method, path, Authorization)."""
    seen = []

    class Handler(SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(("GET", self.path, self.headers.get("Authorization")))
            answer(self)

        def do_HEAD(self):
            seen.append(("HEAD", self.path, self.headers.get("Authorization")))
            answer(self)

    with serving(Handler) as url:
        yield url, seen


def sums_for(files: dict) -> bytes:
    """SHA256SUMS as sha256sum and stat write it, composed here for bytes the test chooses."""
    return ("".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in files.items())
            + "".join(f"# size {len(data)}  {rel}\n" for rel, data in files.items())).encode()


def send(handler, status, body=b"", headers=None, length=True):
    handler.send_response(status)
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    if length:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


STREAMED = 64 << 20  # what the lying mirror sends for a file it says is 14 bytes


def lying_mirror(announce_length):
    """HEAD says 14 bytes; GET streams STREAMED bytes (with or without saying so)."""
    small = b'{"x": "small"}'
    assert len(small) == 14

    def answer(handler):
        if handler.path.endswith("/SHA256SUMS"):
            return send(handler, 200, sums_for({"model.safetensors": small}))
        if handler.command == "HEAD":
            return send(handler, 200, small)
        handler.send_response(200)
        if announce_length:
            handler.send_header("Content-Length", str(STREAMED))
        handler.end_headers()
        block = b"\0" * (1 << 20)
        try:
            for _ in range(STREAMED >> 20):
                handler.wfile.write(block)
        except OSError:  # the client stopped reading: what the cap is for
            pass
    return answer


@pytest.mark.parametrize("announce_length", [False, True], ids=["streamed", "announced"])
def test_a_mirror_that_streams_more_than_declared_is_stopped_at_the_declared_size(models_dir, announce_length,
                                                                                  monkeypatch):
    written = []
    real_copy = copy_capped

    def counting(source, out, spec, where):
        class Counting:
            def write(self, data):
                written.append(len(data))
                return out.write(data)
        return real_copy(source, Counting(), spec, where)

    monkeypatch.setattr(model_weights, "copy_capped", counting)
    with scripted_server(lying_mirror(announce_length)) as (url, seen):
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", "r1", MirrorSource(url, "m", "r1", timeout=10, allow_http=True))
    if announce_length:
        assert str(err.value) == (f"model.safetensors from {url}/m/r1: the mirror announces {STREAMED} bytes,"
                                  " SHA256SUMS declares 14: refused before the download")
        assert written == []
    else:
        assert str(err.value) == (f"model.safetensors from {url}/m/r1: more than the 14 bytes SHA256SUMS declares:"
                                  " the download was stopped there and removed")
        assert sum(written) <= 14  # never a byte past the declared size on disk
    assert [method for method, _, _ in seen] == ["GET", "GET"]  # no HEAD: the size is the declared one
    assert_nothing_left(models_dir)


def test_negative_control_the_old_path_took_heads_size_and_copied_everything(tmp_path):
    """What the red team saw: HEAD's 14 bytes for the disk check, then a plain copy of all
    that came."""
    from ansible.module_utils.urls import open_url
    with scripted_server(lying_mirror(False)) as (url, _):
        with open_url(f"{url}/m/r1/model.safetensors", method="HEAD", timeout=10) as head:
            assert head.headers["Content-Length"] == "14"
        with open_url(f"{url}/m/r1/model.safetensors", timeout=10) as source, open(tmp_path / "x", "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    assert (tmp_path / "x").stat().st_size == STREAMED


def test_the_disk_check_uses_the_declared_sizes(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    sums = mirror / "m" / "r1" / "SHA256SUMS"
    sums.write_text(sums.read_text().replace("# size 16  ", f"# size {10 ** 15 - 1}  "))
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert "GiB free" in str(err.value) and "needs 931322.6 GiB" in str(err.value)
    assert_nothing_left(models_dir)


@pytest.mark.parametrize("edit, words", [
    (lambda text: "\n".join(line for line in text.splitlines() if "sub/x.json" not in line or not line.startswith("#")),
     ["no declared size for sub/x.json", "a file of unknown size is not downloaded", "stat -c"]),
    (lambda text: text + f"# size 3  other.bin\n", ["a size but no sha256 for other.bin"]),
    (lambda text: text + f"# size {'9' * 320}  config.json\n", ["line 9", "is not a sha256sum line",
                                                                "nor a size line", "at most 15 digits"]),
    (lambda text: text + "# size 42  config.json\n", ["line 9: config.json is listed twice"]),
])
def test_sizes_in_sha256sums_must_be_complete_and_sane(models_dir, mirror, edit, words):
    make_model(mirror, shard_bytes=16, sizes=True)
    sums = mirror / "m" / "r1" / "SHA256SUMS"
    sums.write_text(edit(sums.read_text()))
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    for word in words:
        assert word in str(err.value)
    assert_nothing_left(models_dir)


def test_a_plain_sha256sums_without_sizes_is_refused(models_dir, mirror):
    """What a mirror made before this change has: refused with the command that fixes it."""
    make_model(mirror, shard_bytes=16, sizes=False)
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert "no declared size for config.json, model-00001-of-00002.safetensors" in str(err.value)
    assert_nothing_left(models_dir)


def other_origin(target_url):
    """A server that redirects every request to target_url + its path."""
    def answer(handler):
        send(handler, 302, headers={"Location": target_url + handler.path})
    return answer


def test_a_redirect_to_another_origin_is_refused_and_sends_it_nothing(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    with http_mirror(mirror) as (elsewhere, seen_elsewhere):
        with scripted_server(other_origin(elsewhere)) as (url, seen):
            with pytest.raises(WeightsError) as err:
                stage(str(models_dir), "m", "r1", MirrorSource(url.replace("http://", "http://fleet:secret@"), "m",
                                                               "r1", timeout=10, allow_http=True))
    assert str(err.value) == (
        f"the mirror redirected {url}/m/r1/SHA256SUMS to another origin, {elsewhere}/m/r1/SHA256SUMS: refused,"
        " a mirror's requests (and its credentials) stay with the scheme, host and port vllm_fleet_model_mirror"
        " names; serve the files there, or name that origin as the mirror")
    assert seen_elsewhere == []  # the other origin never saw a request, let alone the credentials
    assert seen[0][2] == "Basic " + base64.b64encode(b"fleet:secret").decode()
    assert_nothing_left(models_dir)


def test_negative_control_urllib_sends_the_credentials_to_the_other_origin(mirror):
    """The old path (open_url as it was called, urllib's redirects): the other host got the header."""
    from ansible.module_utils.urls import open_url
    make_model(mirror, shard_bytes=16)
    header = "Basic " + base64.b64encode(b"fleet:secret").decode()
    with http_mirror(mirror) as (elsewhere, seen_elsewhere):
        with scripted_server(other_origin(elsewhere)) as (url, _):
            with open_url(f"{url}/m/r1/SHA256SUMS", headers={"Authorization": header}, timeout=10) as answer:
                assert answer.read().startswith(b"")
    assert seen_elsewhere == [("GET", "/m/r1/SHA256SUMS", header)]


def test_a_redirect_within_the_origin_is_followed_with_the_credentials(models_dir, mirror):
    files = make_model(mirror, shard_bytes=16)

    def answer(handler):  # /m/... moved to /moved/m/... on the same origin
        if handler.path.startswith("/moved/"):
            return send(handler, 200, (mirror / handler.path[len("/moved/"):]).read_bytes())
        send(handler, 301, headers={"Location": "/moved" + handler.path})
    with scripted_server(answer) as (url, seen):
        result = stage(str(models_dir), "m", "r1", MirrorSource(url.replace("http://", "http://fleet:secret@"),
                                                                "m", "r1", timeout=10, allow_http=True))
    assert result["changed"] is True and result["source"] == f"{url}/m/r1"
    assert_staged(models_dir, "m", "r1", files)
    assert len(seen) == 2 * 5 and {header for _, _, header in seen} == {
        "Basic " + base64.b64encode(b"fleet:secret").decode()}


# --- a hostile directory mirror, the marker, a pinned SHA256SUMS, plain http -----------------


@pytest.mark.parametrize("link", ["file", "subdir", "revision", "sums"])
def test_a_directory_mirrors_symbolic_links_are_refused(tmp_path, models_dir, mirror, link):
    secret = tmp_path / "root-only"
    (secret / "sub").mkdir(parents=True)
    (secret / "sub" / "x.json").write_bytes(b'{"x": 1}\n')
    (secret / "config.json").write_bytes(b"root only\n")
    files = make_model(mirror, shard_bytes=16)
    rev = mirror / "m" / "r1"
    where = {"file": rev / "config.json", "subdir": rev / "sub", "revision": rev, "sums": rev / "SHA256SUMS"}[link]
    if link == "revision":
        shutil.move(str(rev), str(secret / "r1"))
        os.symlink(secret / "r1", rev)
    elif link == "subdir":
        shutil.rmtree(rev / "sub")
        os.symlink(secret / "sub", rev / "sub")  # same bytes, so only the link can be refused
    else:
        os.replace(where, secret / where.name) if link == "sums" else where.unlink()
        if link == "file":
            (secret / "config.json").write_bytes(files["config.json"])
        os.symlink(secret / where.name, where)
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert str(err.value) == (f"{where} is a symbolic link: a directory mirror's links are refused (root would"
                              " follow them anywhere on the node); put the file itself in the mirror")
    assert_nothing_left(models_dir)


def test_negative_control_the_old_path_followed_a_mirrors_link(tmp_path, mirror):
    """The old local read, open(<mirror>/<name>/<revision>/<file>): a link planted by whoever
    writes the mirror was followed (here to a root-only file)."""
    secret = tmp_path / "root-only"
    secret.write_bytes(b"root only\n")
    os.chmod(secret, 0o600)
    make_model(mirror, shard_bytes=16)
    (mirror / "m" / "r1" / "config.json").unlink()
    os.symlink(secret, mirror / "m" / "r1" / "config.json")
    with open(os.path.join(str(mirror / "m" / "r1"), "config.json"), "rb") as handle:
        assert handle.read() == b"root only\n"


def test_a_fifo_in_a_directory_mirror_is_refused_without_hanging(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    (mirror / "m" / "r1" / "config.json").unlink()
    os.mkfifo(mirror / "m" / "r1" / "config.json")
    with pytest.raises(WeightsError, match=r"config.json is not a regular file"):
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert_nothing_left(models_dir)


@pytest.mark.parametrize("line", [f"{'a' * 64}  {MARKER}", f"# size 3  {MARKER}"])
def test_the_markers_name_cannot_be_listed(line):
    with pytest.raises(WeightsError) as err:
        parse_sums(f"{line}\n", "SHA256SUMS")
    assert str(err.value) == (f"SHA256SUMS line 1: {MARKER} is the name of vllm-fleet's own marker (written last,"
                              " it says a model is complete): a model cannot list a file of that name")


def test_a_model_listing_the_marker_is_not_staged(models_dir, mirror):
    """The marker listed (and served) by the mirror: staging it would put the mirror's own marker
    in place of the one written last."""
    make_model(mirror, shard_bytes=16)
    rev = mirror / "m" / "r1"
    (rev / MARKER).write_text('{"files": {}}')
    sums = subprocess.run(["sha256sum", MARKER], cwd=rev, check=True, capture_output=True, text=True).stdout
    (rev / "SHA256SUMS").write_text(sums + (rev / "SHA256SUMS").read_text() + f"# size 13  {MARKER}\n")
    with pytest.raises(WeightsError, match=f"line 1: {MARKER} is the name of vllm-fleet's own marker"):
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert_nothing_left(models_dir)


def test_a_pinned_sha256sums_digest_is_checked_before_any_download(models_dir, mirror):
    files = make_model(mirror, shard_bytes=16)
    sums = mirror / "m" / "r1" / "SHA256SUMS"
    pinned = subprocess.run(["sha256sum", str(sums)], check=True, capture_output=True, text=True).stdout.split()[0]
    # The mirror swaps the model: other bytes, and a SHA256SUMS that matches them.
    make_model(mirror, "m", "swapped", shard_bytes=16)
    shutil.rmtree(mirror / "m" / "r1")
    os.rename(mirror / "m" / "swapped", mirror / "m" / "r1")
    swapped = hashlib.sha256(sums.read_bytes()).hexdigest()
    with http_mirror(mirror) as (url, seen):
        with pytest.raises(WeightsError) as err:
            run(params(models_dir=str(models_dir), name="m", revision="r1", mirror=url, allow_http=True,
                       sha256sums_digest=pinned), check_mode=False)
        assert [path for _, path, _ in seen] == ["/m/r1/SHA256SUMS"]  # nothing else was asked for
    assert str(err.value) == (f"{url}/m/r1/SHA256SUMS has sha256 {swapped}, the profile pins {pinned}"
                              " (profile.weights.sha256sums_digest): the mirror's model is not the one the profile"
                              " was tested with; nothing was downloaded")
    assert_nothing_left(models_dir)
    # Negative control: without the pin the swapped model is staged (its own hashes agree).
    result = run(params(models_dir=str(models_dir), name="m", revision="r1", mirror=str(mirror)), check_mode=False)
    assert result["changed"] is True and (models_dir / "m@r1" / "config.json").read_bytes() == files["config.json"]
    assert (models_dir / "m@r1" / SHARD).read_bytes() != files[SHARD]
    # and with the right pin the right model is.
    shutil.rmtree(models_dir / "m@r1")
    make_model(mirror, "m", "r2", shard_bytes=16)
    right = hashlib.sha256((mirror / "m" / "r2" / "SHA256SUMS").read_bytes()).hexdigest()
    assert run(params(models_dir=str(models_dir), name="m", revision="r2", mirror=str(mirror),
                      sha256sums_digest=right), check_mode=False)["changed"] is True


@pytest.mark.parametrize("weights, words", [
    ({"name": "m", "revision": "r1", "sha256sums_digest": "A" * 64}, ["sha256sums_digest: 'AAAA", "64 lower-case hex"]),
    ({"name": "m", "revision": "r1", "sha256sums_digest": 12}, ["sha256sums_digest: '12'"]),
    ({"name": "m", "revision": COMMIT, "hub_repo": "org/m", "sha256sums_digest": "a" * 64},
     ["sha256sums_digest pins a mirror's SHA256SUMS", "remove one of the two"]),
])
def test_check_model_refuses_a_bad_pin(weights, words):
    with pytest.raises(WeightsError) as err:
        check_model(weights)
    for word in words:
        assert word in str(err.value)


def test_plain_http_needs_the_opt_in(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    with http_mirror(mirror) as (url, seen):
        with pytest.raises(WeightsError) as err:
            run(params(models_dir=str(models_dir), name="m", revision="r1",
                       mirror=url.replace("http://", "http://fleet:secret@")), check_mode=False)
        assert seen == []
        # negative control: with the opt-in the same mirror is read
        assert run(params(models_dir=str(models_dir), name="m", revision="r1", mirror=url, allow_http=True),
                   check_mode=False)["changed"] is True
    assert str(err.value) == (f"vllm_fleet_model_mirror: {url} is plain http: anyone on the way can read its"
                              " credentials and change the files it serves. Use https, or set"
                              " vllm_fleet_model_allow_http: true to accept that")


@pytest.mark.parametrize("endpoint, words", [
    ("http://hub.example.internal", ["vllm_fleet_model_hub_endpoint: http://hub.example.internal is plain http",
                                     "vllm_fleet_model_allow_http: true"]),
    ("https://user:hubpass@hub.example.internal", ["'https://hub.example.internal' is not an http(s):// URL without"
                                                   " credentials", "vllm_fleet_model_hub_token_file"]),
    ("ftp://hub.example.internal", ["'ftp://hub.example.internal' is not an http(s):// URL"]),
])
def test_a_hub_endpoint_must_be_https_without_credentials(endpoint, words):
    with pytest.raises(WeightsError) as err:
        HubSource("org/m", COMMIT, endpoint=endpoint)
    for word in words:
        assert word in str(err.value)
    assert "hubpass" not in str(err.value)


def test_a_sha256sums_over_its_cap_is_refused_unread(models_dir, mirror):
    make_model(mirror, shard_bytes=16)
    sums = mirror / "m" / "r1" / "SHA256SUMS"
    sums.write_text(sums.read_text() + "#" * (2 << 20) + "\n")  # a comment sha256sum would skip
    with pytest.raises(WeightsError) as err:
        stage(str(models_dir), "m", "r1", MirrorSource(str(mirror), "m", "r1"))
    assert str(err.value) == f"{sums} is over 1048576 bytes: refused"
    assert_nothing_left(models_dir)


@needs_hub
def test_a_hub_file_without_a_size_is_refused(models_dir, monkeypatch):
    with FakeHub("org/m", COMMIT, HUB_FILES, lfs=LFS) as hub:
        listed = hub.info()
        del listed["siblings"][0]["size"]  # config.json, a git file: its size is the sibling's
        monkeypatch.setattr(hub, "info", lambda: listed)
        with pytest.raises(WeightsError) as err:
            stage(str(models_dir), "m", COMMIT, HubSource("org/m", COMMIT, endpoint=hub.url, allow_http=True))
        assert not any("/resolve/" in path for _, path, _ in hub.requests)
    assert str(err.value) == (f"the Hub gave no size for config.json of {hub.url}/org/m@{COMMIT}: a file of unknown"
                              " size is not downloaded")
    assert_nothing_left(models_dir)
