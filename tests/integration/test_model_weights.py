"""Model weights as a managed artifact (issue 13, item 2) on a simulated canary, from a site
mirror that is a real HTTP server on this host (the nodes share its loopback): a profile with
`weights` is staged in the parallel pre-stage, verified per file against the mirror's
SHA256SUMS (written by the real `sha256sum`, with each file's size from the real `stat`), and served from `<root>/models/<name>@<revision>`;
an unused staged model is pruned. A corrupt file, a missing revision and a model missing at
the drain each stop the run before the node leaves traffic, the node still serving.

The model is one the test makes: a config, a tokenizer and a small safetensors file (the
format's 8-byte header length, JSON header, then the data), a few MB.

Tests run in file order on one fleet (one provisioning)."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import threading
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.fixtures.simnode.simnode import free_port
from tests.fixtures.story import ACCEPT_PRE_FIX, FP8, PRE_FIX, node_exec, play, provisioned_fleet, state

NAME = FP8["name"]
MODELS = "/opt/vllm-fleet/models"
# The shipped FP8 profile with its model staged by vllm-fleet instead of a site path.
STAGED = {key: value for key, value in FP8.items() if key != "model"}
TURN = {"release": PRE_FIX, "accept": ACCEPT_PRE_FIX, "vllm_fleet_rollout_soak": False}


def weights(revision: str) -> dict:
    return {**STAGED, "weights": {"name": NAME, "revision": revision}}


def make_model(directory, seed: int) -> None:
    """config.json, tokenizer.json and model.safetensors (2 MiB of float32), then SHA256SUMS
    as the real sha256sum writes it, each file's size appended by the real stat (as
    roles/vllm_model/README.md tells operators to make it)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "seed": seed}))
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    data = os.urandom(2 * 2**20)
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(data) // 4], "data_offsets": [0, len(data)]}}).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    names = ["config.json", "tokenizer.json", "model.safetensors"]
    sums = subprocess.run(["sha256sum", *names], cwd=directory, check=True, capture_output=True, text=True).stdout
    sizes = subprocess.run(["stat", "-c", "# size %s  %n", *names], cwd=directory, check=True,
                           capture_output=True, text=True).stdout
    (directory / "SHA256SUMS").write_text(sums + sizes)


class Mirror:
    """A site mirror: Python's own static file server over a directory, recording each GET."""

    def __init__(self, root):
        self.root, self.gets = root, []
        gets = self.gets

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                gets.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("models"), f"vf-models-{os.getpid()}-", 2) as sim:
        yield sim


@pytest.fixture(scope="module")
def mirror(fleet):
    root = fleet.directory / "mirror"
    for seed, revision in enumerate(("r1", "r2", "r4")):
        make_model(root / NAME / revision, seed)
    # r2's weights changed after its SHA256SUMS was written: what a bad sync or a disk error leaves.
    # Its last byte flipped in place (the same size: only the sha256 can tell).
    with open(root / NAME / "r2" / "model.safetensors", "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x00" if last != b"\x00" else b"\x01")
    served = Mirror(root)
    yield served
    served.server.shutdown()
    served.server.server_close()


def rollout(fleet, mirror, profile_, *args, allow_http=True):
    """The canary alone (node01): what the model does to one turn. The test's mirror is plain
    http on loopback: opted in explicitly, as a site would have to."""
    return play(fleet, "rollout.yml", "--limit", "canary", *args, profile_=profile_,
                vllm_fleet_model_mirror=mirror.url, vllm_fleet_model_allow_http=allow_http, **TURN)


def served_config(fleet) -> str:
    return node_exec(fleet, "node01", "grep '^model:' /etc/vllm-fleet/gpu0.yaml")


def test_a_profile_with_weights_is_staged_while_the_node_serves_and_then_served_from_its_directory(fleet, mirror):
    # A model no configuration names, staged by an earlier run: the pre-stage prunes it.
    node_exec(fleet, "node01", f"mkdir -p {MODELS}/old@0 && echo '{{\"files\": {{}}}}' > {MODELS}/old@0/vllm-fleet-model.json")
    run = rollout(fleet, mirror, weights("r1"))
    assert run.rc == 0, run.output[-4000:]
    path = f"{MODELS}/{NAME}@r1"
    assert served_config(fleet) == f'model: "{path}"'
    # Staged in the pre-stage, before the node left traffic; checked again just before it did.
    tasks = [line for line in run.output.splitlines() if line.startswith("TASK [")]
    order = [[i for i, line in enumerate(tasks) if name in line][:1] for name in
             ("Stage the profile's model weights", "Check that the profile's model is staged",
              "Drain the node in the load balancer")]
    assert all(order) and order == sorted(order), "\n".join(tasks)
    assert sorted(mirror.gets) == sorted(f"/{NAME}/r1/{name}" for name in
                                         ("SHA256SUMS", "config.json", "tokenizer.json", "model.safetensors"))
    # The bytes on the node are the mirror's, and the marker records each file's sha256.
    sums = (fleet.directory / "mirror" / NAME / "r1" / "SHA256SUMS").read_text()
    node_exec(fleet, "node01", f"cat > /tmp/SHA256SUMS <<'EOF'\n{sums}EOF")
    assert node_exec(fleet, "node01", f"cd {path} && sha256sum -c --strict /tmp/SHA256SUMS") == \
        "config.json: OK\ntokenizer.json: OK\nmodel.safetensors: OK"
    marker = json.loads(node_exec(fleet, "node01", f"cat {path}/vllm-fleet-model.json"))
    assert marker["source"] == f"{mirror.url}/{NAME}/r1" and len(marker["files"]) == 3
    # vLLM serves it (the stand-in reports the model it was given as root, as vLLM does).
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.port(1)}/v1/models", timeout=30) as answer:
        assert json.load(answer)["data"][0]["root"] == path
    # Pruned: the model no configuration names; kept: the one just staged.
    assert node_exec(fleet, "node01", f"ls {MODELS}") == f"{NAME}@r1"
    assert state(fleet, "node01")["ActiveState"] == "active"


def test_a_file_that_does_not_match_its_checksum_stops_the_run_before_the_drain(fleet, mirror):
    before = state(fleet, "node01")
    run = rollout(fleet, mirror, weights("r2"))
    assert run.rc != 0
    assert "model.safetensors from " + mirror.url + f"/{NAME}/r2: sha256 " in run.output, run.output[-4000:]
    assert "the manifest says" in run.output and "Drain the node in the load balancer" not in run.output
    # Nothing serving was touched: the same process serves the same model; nothing half-staged.
    assert state(fleet, "node01") == {**before}
    assert served_config(fleet) == f'model: "{MODELS}/{NAME}@r1"'
    assert node_exec(fleet, "node01", f"ls -A {MODELS}") == f"{NAME}@r1"


def test_weights_without_a_revision_are_refused_before_anything_changes(fleet, mirror):
    mirror.gets.clear()
    run = rollout(fleet, mirror, {**STAGED, "weights": {"name": NAME}})
    assert run.rc != 0
    assert "profile.weights.revision is required" in run.output, run.output[-3000:]
    assert "Take the rollout lock" not in run.output and mirror.gets == []


def test_a_model_missing_at_the_drain_stops_the_turn_with_the_node_serving(fleet, mirror):
    """The check before the drain, on its own: the pre-stage's staging skipped by its tag."""
    before = state(fleet, "node01")
    run = rollout(fleet, mirror, weights("r4"), "--skip-tags", "stage")
    assert run.rc != 0
    assert f"the model {NAME}@r4 is not ready on this node: {MODELS}/{NAME}@r4 is not staged" in run.output, \
        run.output[-4000:]
    assert "Drain the node in the load balancer" not in run.output
    assert state(fleet, "node01") == before
    assert served_config(fleet) == f'model: "{MODELS}/{NAME}@r1"'


def test_a_plain_http_mirror_without_the_opt_in_stops_the_run_before_the_drain(fleet, mirror):
    before = state(fleet, "node01")
    mirror.gets.clear()
    run = rollout(fleet, mirror, weights("r4"), allow_http=False)
    assert run.rc != 0
    assert (f"vllm_fleet_model_mirror: {mirror.url} is plain http" in run.output
            and "vllm_fleet_model_allow_http: true" in run.output), run.output[-4000:]
    assert "Drain the node in the load balancer" not in run.output and mirror.gets == []
    assert state(fleet, "node01") == before
    assert served_config(fleet) == f'model: "{MODELS}/{NAME}@r1"'
