"""The bad-input matrix (docs/BAD-INPUT.md): malformed inventory variables, profiles, release
pins, catalogues and command lines, each given to `vllm-fleet rollout` against one simulated
sm_120 node. Each must be refused with a message naming the input, with no Python traceback
(checked by vllm_fleet()), before anything on the node changes.

The node serves nothing yet: any file the rollout wrote (a release, a unit, a config) would
show in its snapshot, and a bad input that slipped through would fail on the missing
wheelhouse, not pass."""
from __future__ import annotations

import json

import pytest

from tests.fixtures.simnode import simnode
from tests.fixtures.story import EXIT0, FIXED, NVFP4, PRE_FIX
from tests.integration.conftest import PREFIX, profile_path
from tests.integration.playbook import vllm_fleet

BAD_CATALOGUE = "schema_version: 1\nknown_issues:\n  - id: incomplete-entry\n    title: an entry with no match and no fix\n"
NOT_YAML = "known_issues: [\n  - {id: \"unterminated\n"
# 414 bytes that YAML's aliases expand to 9**9 references (152 MB of module arguments before issue 14)
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("bcdefgh", "cdefghi"))
DUPLICATE_KEY = "schema_version: 1\nknown_issues: []\nknown_issues: []\n"
TOO_LARGE = "schema_version: 1\nknown_issues: []\n#" + "x" * (1024 * 1024) + "\n"


def release(**pins) -> dict:
    return {"vllm_fleet_release": {**FIXED, **pins}}


def profile(**serve_args) -> dict:
    return {"vllm_fleet_profile": {**NVFP4, "serve_args": {**NVFP4["serve_args"], **serve_args}}}


def instances(*items) -> dict:
    return {"vllm_fleet_instances": list(items)}


# id -> (extra vars, the words the refusal must contain, exit code: 1 failed, 2 usage, 3 blocked)
PLAYBOOK_CASES = {
    # release pins
    "cudnn-package-not-a-choice": (release(cudnn_package="nvidia-cudnn-cu11"), "nvidia-cudnn-cu11", 1),
    "cudnn-version-not-a-version": (release(cudnn="nine"), "versions.cudnn: 'nine' is not a valid version", 1),
    "vllm-pin-is-a-range": (release(vllm=">=0.25"), "versions.vllm: '>=0.25' is not a valid version", 1),
    "release-without-torch": ({"vllm_fleet_release": {k: v for k, v in FIXED.items() if k != "torch"}},
                              "torch", 1),
    "release-not-a-map": ({"vllm_fleet_release": "0.25.1"}, "vllm_fleet_release", 1),
    "known-bad-plan-cudnn-9.19": (release(cudnn=PRE_FIX["cudnn"]), "cudnn-sm12x-fusion-matmul-oob", 3),
    # profiles
    "profile-name-unknown": ({"vllm_fleet_profile_name": "qwen-nope"},
                             "vllm_fleet_profile_name: qwen-nope is not a profile", 1),
    "profile-misspelt-flag": (profile(**{"max-model-length": 8192}), "max-model-length", 1),
    "profile-flag-wrong-type": (profile(**{"gpu-memory-utilization": "lots"}), "gpu-memory-utilization", 1),
    "profile-flag-out-of-range": (profile(**{"gpu-memory-utilization": 1.5}), "gpu-memory-utilization", 1),
    "profile-nvfp4-kv-cache-on-sm120": (profile(**{"kv-cache-dtype": "nvfp4"}), "nvfp4-kv-cache-sm12x", 3),
    # flag injection and oversized values (issue 14): vllm serve --config makes each list item an argv word
    "profile-list-item-sets-the-api-key": (
        profile(**{"served-model-name": ["qwen", "--api-key", "known-key", "--host", "0.0.0.0"]}),
        "--served-model-name item 1", 1),
    "profile-value-begins-with-a-dash": (profile(tokenizer="--host=0.0.0.0"), "begins with '-'", 1),
    "profile-value-with-a-newline": (profile(tokenizer="qwen\n--port 1"), "control character", 1),
    "profile-mapping-spells-a-flag": (profile(**{"compilation-config": {"level": "--api-key"}}),
                                      "spells a flag", 1),
    "profile-reserved-flag-port": (profile(port=9999), "--port is not set in a profile", 1),
    "profile-model-too-long": ({"vllm_fleet_profile": {**NVFP4, "model": "m" * 20000}},
                               "profile.model: is 20000 characters long: at most 4096", 1),
    "profile-name-with-control-character": ({"vllm_fleet_profile": {**NVFP4, "name": "stable\x1b[2J"}},
                                            "profile.name", 1),
    # accepted risks
    "accept-unknown-id": ({"vllm_fleet_accepted_risks": [{"id": "no-such-issue", "reason": "x"}]},
                          "id 'no-such-issue' is not in the known-issues catalogue", 1),
    "accept-without-reason": ({"vllm_fleet_accepted_risks": [{"id": EXIT0["id"], "reason": ""}]},
                              "a non-empty reason is required", 1),
    # catalogue
    "catalogue-missing": ({"vllm_fleet_catalogue_path": "/nonexistent/known_issues.yml"},
                          "/nonexistent/known_issues.yml", 1),
    "catalogue-incomplete-entry": ("BAD_CATALOGUE", "incomplete-entry", 1),
    "catalogue-not-yaml": ("NOT_YAML", "is not YAML (line 2, column 3)", 1),
    "catalogue-alias-bomb": ("ALIAS_BOMB", "an anchor (&a) is not allowed", 1),
    "catalogue-duplicate-key": ("DUPLICATE_KEY", "duplicate key 'known_issues' (first at line 2)", 1),
    "catalogue-too-large": ("TOO_LARGE", "is larger than 1048576 bytes", 1),
    # risky environment names: blockers of the catalogue, unless accepted by id with a reason
    "profile-env-ld-preload": ({"vllm_fleet_profile": {**NVFP4, "env": {**NVFP4["env"], "LD_PRELOAD": "/tmp/x.so"}}},
                               "env-ld-preload", 3),
    "profile-env-pythonpath": ({"vllm_fleet_profile": {**NVFP4, "env": {**NVFP4["env"], "PYTHONPATH": "/tmp"}}},
                               "env-pythonpath", 3),
    "profile-env-vllm-server-dev-mode": (
        {"vllm_fleet_profile": {**NVFP4, "env": {**NVFP4["env"], "VLLM_SERVER_DEV_MODE": "1"}}},
        "env-vllm-server-dev-mode", 3),
    "profile-env-value-with-escape": ({"vllm_fleet_profile": {**NVFP4, "env": {**NVFP4["env"], "X": "a\x1b[2J"}}},
                                      "profile.env.X", 1),
    # inventory: instances, batches, soak, API key
    "instance-port-not-a-number": (instances({"name": "gpu0", "gpu": 0, "port": "http"}), "port", 1),
    "instance-name-with-space": (instances({"name": "GPU 0", "gpu": 0, "port": 18751}), "vllm_fleet_instances", 1),
    "instances-share-a-port": (instances({"name": "gpu0", "gpu": 0, "port": 18751},
                                         {"name": "gpu1", "gpu": 1, "port": 18751}), "vllm_fleet_instances", 1),
    "instances-share-a-gpu": (instances({"name": "gpu0", "gpu": 0, "port": 18751},
                                        {"name": "gpu1", "gpu": 0, "port": 18752}), "vllm_fleet_instances", 1),
    "instance-port-out-of-range": (instances({"name": "gpu0", "gpu": 0, "port": 70000}), "vllm_fleet_instances", 1),
    "instance-on-a-gpu-the-node-lacks": (instances({"name": "gpu0", "gpu": 3, "port": 18751}),
                                         "instance gpu0 is on GPU 3, which is not on this node", 1),
    "batch-of-zero": ({"vllm_fleet_rollout_batches": [1, 0]}, "vllm_fleet_rollout_batches", 1),
    "batch-plan-a-string": ({"vllm_fleet_rollout_batches": "1,2"}, "vllm_fleet_rollout_batches", 1),
    "batch-over-100-percent": ({"vllm_fleet_rollout_batches": ["150%"]}, "vllm_fleet_rollout_batches", 1),
    "soak-duration-negative": ({"vllm_fleet_soak_duration_s": -5}, "vllm_fleet_soak_duration_s", 1),
    "soak-minimum-beyond-duration": ({"vllm_fleet_soak_min_duration_s": 99999}, "vllm_fleet_soak_min_duration_s", 1),
    "soak-wedge-window-under-two-samples": ({"vllm_fleet_soak_wedge_window_s": 1}, "vllm_fleet_soak_wedge_window_s", 1),
    "soak-tolerance-5-meant-as-5-percent": ({"vllm_fleet_soak_tolerances": {"total_token_throughput": 5}},
                                            "vllm_fleet_soak_tolerances.total_token_throughput is 5: a tolerance "
                                            "is a fraction, 0 < tolerance < 0.5", 1),
    "soak-baseline-not-a-mapping": ({"vllm_fleet_soak_baseline": 12800}, "vllm_fleet_soak_baseline must be a "
                                    "mapping of metric name to number, got an integer 12800", 1),
    "api-key-with-spaces": ({"vllm_fleet_service_api_key": "not a key"}, "vllm_fleet_service_api_key", 1),
    # whole-value matches: $ would accept a final newline (issue 14)
    "api-key-with-a-trailing-newline": ({"vllm_fleet_service_api_key": "a" * 20 + "\n"},
                                        "vllm_fleet_service_api_key may hold only", 1),
    "api-key-too-long": ({"vllm_fleet_service_api_key": "a" * 2000}, "vllm_fleet_service_api_key may hold only", 1),
    "instance-name-with-a-trailing-newline": (instances({"name": "gpu0\n", "gpu": 0, "port": 18751}),
                                              "vllm_fleet_instances", 1),
    "profile-name-unknown-with-path": ({"vllm_fleet_profile_name": "../catalogue/known_issues"},
                                       "is not a profile", 1),
    # a newline would add a setting to the pip.conf and uv.toml that the install writes (issue 14)
    "index-url-with-a-newline": ({"vllm_fleet_runtime_offline": False,
                                  "vllm_fleet_runtime_index_url": "https://pypi.example/simple\nno-index = true"},
                                 "vllm_fleet_runtime_index_url holds whitespace or a control character", 1),
    # a rotation's window (docs/SECURITY.md): the old keys stay accepted beside the new one
    "retiring-keys-without-a-key": ({"vllm_fleet_service_api_key_retiring": ["old-key-0123456789abcdef"]},
                                    "vllm_fleet_service_api_key_retiring needs vllm_fleet_service_api_key", 1),
    "retiring-key-is-the-key": ({"vllm_fleet_service_api_key": "same-key-0123456789abcdef",
                                 "vllm_fleet_service_api_key_retiring": ["ok-old-key-0123456789", "same-key-0123456789abcdef"]},
                                "vllm_fleet_service_api_key_retiring: key 2 (counted from 1)", 1),
}

CLI_CASES = {
    "extra-vars-not-json": (["-e", "{not json"], "--extra-vars", 2),
    "inventory-missing": (["-i", "/nonexistent/inventory.yml"], "no such file", 2),
    "unknown-command": (["deploy"], "invalid choice: 'deploy'", 2),
    "limit-matches-no-host": (["--limit", "no-such-node"], "matches no host", 2),
}


@pytest.fixture(scope="module")
def node(node_image, fake_nvml_lib, tmp_path_factory):
    prefix = f"{PREFIX}bad-"
    started = simnode.start_node("node01", nvml_lib=fake_nvml_lib, nvml_profile=profile_path("rtx_pro_6000"),
                                 image=node_image, prefix=prefix)
    directory = tmp_path_factory.mktemp("bad-input")
    inventory = simnode.write_inventory(
        [started], directory / "inventory.yml", {"canary": ["node01"]},
        all_vars={"vllm_fleet_runtime_offline": True, "vllm_fleet_runtime_find_links": ["/srv/wheelhouse"],
                  "vllm_fleet_accepted_risks": [EXIT0], "vllm_fleet_release": FIXED,
                  # A rollout lock of its own (on this host): test sessions run side by side.
                  "vllm_fleet_rollout_lock_path": str(directory / "rollout.lock")})
    yield started, inventory
    simnode.remove_nodes(prefix)


def snapshot(node: simnode.Node) -> str:
    return node.exec("find /opt /etc/vllm-fleet /etc/systemd/system -printf '%p %s %T@\\n' 2>/dev/null | sort").stdout


def refused(node, tmp_path, args, needle, code):
    before = snapshot(node)
    got, output, summary, _ = vllm_fleet(tmp_path, *args, timeout=300)
    assert got == code, output[-3000:]
    assert needle in output, output[-3000:]
    assert snapshot(node) == before
    return summary


@pytest.mark.parametrize("case", PLAYBOOK_CASES)
def test_a_bad_input_is_refused_before_any_change(case, node, tmp_path):
    started, inventory = node
    extra, needle, code = PLAYBOOK_CASES[case]
    if isinstance(extra, str):  # a catalogue file of that content
        path = tmp_path / "known_issues.yml"
        path.write_text(globals()[extra])
        extra = {"vllm_fleet_catalogue_path": str(path)}
    summary = refused(started, tmp_path, ["rollout", "-i", str(inventory), "-e", json.dumps(extra)], needle, code)
    assert summary["hosts"]["node01"]["status"] in ("failed", "blocked"), summary


@pytest.mark.parametrize("case", CLI_CASES)
def test_a_bad_command_line_is_a_usage_error(case, node, tmp_path):
    started, inventory = node
    args, needle, code = CLI_CASES[case]
    command = args if args[0] == "deploy" else ["rollout", *(["-i", str(inventory)] if "-i" not in args else []),
                                                *args]
    refused(started, tmp_path, command, needle, code)
