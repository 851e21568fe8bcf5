"""The known-issues catalogue: the shipped data, its validation, evaluation and the verdict."""

import copy
import dataclasses
import fnmatch
import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.known_issues import (
    CatalogueError,
    PlanError,
    blocked_message,
    evaluate,
    judge,
    load_catalogue,
    match_kernel,
)

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE_DOC = yaml.safe_load((ROOT / "catalogue" / "known_issues.yml").read_text())
ENTRIES = load_catalogue(CATALOGUE_DOC)

CUDNN = "cudnn-sm12x-fusion-matmul-oob"
NVFP4_KV = "nvfp4-kv-cache-sm12x"
E8M0 = "deepgemm-e8m0-enabled-sm12x"
EAGER = "enforce-eager-is-not-a-fix"
B12X = "moe-backend-flashinfer-b12x"
CUDA13 = "vllm-cuda13-wheels-old-driver"
RETIRED = "gpu-retired-pages-pending"
REMAP_PENDING = "gpu-row-remap-pending"
REMAP_FAILURE = "gpu-row-remap-failure"
EXIT0 = "vllm-api-server-exits-0-on-engine-death"
# Environment names that change what code runs or what the API exposes (issue 14).
RISKY_ENV = {"LD_PRELOAD": "env-ld-preload", "LD_LIBRARY_PATH": "env-ld-library-path", "LD_AUDIT": "env-ld-audit",
             "PYTHONPATH": "env-pythonpath", "PYTHONHOME": "env-pythonhome", "PYTHONSTARTUP": "env-pythonstartup",
             "VLLM_SERVER_DEV_MODE": "env-vllm-server-dev-mode",
             "VLLM_ALLOW_INSECURE_SERIALIZATION": "env-vllm-allow-insecure-serialization"}


def device(index=0, cc="12.0", **fields):
    base = {
        "index": index, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "compute_capability": cc, "sm": "sm_" + cc.replace(".", ""),
        "retired_pages_pending": False, "remapped_rows_pending": False, "remapped_rows_failure": False,
    }
    base.update(fields)
    return base


def gpu(*devices, cuda="13.0", driver="580.95.05"):
    devices = list(devices) or [device()]
    return {"available": True, "error": None, "reason": None, "driver_version": driver,
            "cuda_driver_version": cuda, "device_count": len(devices), "devices": devices}


def plan(versions=None, serve_args=None, env=None):
    """The stable sm_120 profile (DESIGN.md), with overrides."""
    out = {
        "versions": {"vllm": "0.25.1", "torch": "2.11.0", "cudnn": "9.24.0.43"},
        "serve_args": {"kv-cache-dtype": "fp8", "enforce-eager": False, "max-num-seqs": 128},
        "env": {"VLLM_USE_DEEP_GEMM_E8M0": "0"},
    }
    out["versions"].update(versions or {})
    out["serve_args"].update(serve_args or {})
    out["env"].update(env or {})
    return out


def ids(findings):
    return {f["id"] for f in findings}


def find(findings, entry_id):
    [finding] = [f for f in findings if f["id"] == entry_id]
    return finding


# --- the shipped catalogue -----------------------------------------------------------------

def test_shipped_catalogue_validates_and_has_the_required_entries():
    assert CATALOGUE_DOC["schema_version"] == 1
    assert {e.id for e in ENTRIES} == {CUDNN, NVFP4_KV, E8M0, EAGER, B12X, CUDA13, RETIRED,
                                       REMAP_PENDING, REMAP_FAILURE, EXIT0, *RISKY_ENV.values()}
    severity = {e.id: e.severity for e in ENTRIES}
    assert [k for k, v in severity.items() if v == "warning"] == [EAGER, B12X, EXIT0]
    assert all(e.evidence for e in ENTRIES)


# Where an evidence line may come from: this fleet's own dump, measurements and notes, or a
# named upstream source that was read. Preflight prints these lines to operators.
EVIDENCE_SOURCE = re.compile(r"(This fleet's [^:]+|vLLM issue #\d+|Upstream vLLM [^:]+|vLLM source, [^:]+|NVML API): \S")


def unsourced(entries):
    return [(e.id, line) for e in entries for line in e.evidence if not EVIDENCE_SOURCE.match(line)]


def test_every_evidence_line_says_where_it_comes_from():
    assert unsourced(ENTRIES) == []
    # Negative control: a bare claim is caught.
    bare = dataclasses.replace(ENTRIES[0], evidence=("cuDNN 9.23.1 fixed it.",))
    assert unsourced([bare]) == [(CUDNN, "cuDNN 9.23.1 fixed it.")]


def test_catalogue_texts_claim_only_what_is_known():
    cudnn = next(e for e in ENTRIES if e.id == CUDNN)
    texts = [cudnn.symptom, cudnn.fix, *cudnn.evidence]
    # The dump showed a store past the kernel's shared memory, not past a number of bytes.
    assert "stores past its shared memory" in cudnn.symptom and "99 KB" not in " ".join(texts)
    # No release note was read: none may be cited as a source.
    for entry in ENTRIES:
        for line in entry.evidence:
            assert "release notes" not in line.lower() or "were not read" in line, (entry.id, line)


def test_stable_profile_on_sm120_has_no_blocker():
    report = judge(ENTRIES, gpu(), None, plan(), [])
    assert report["blockers"] == []
    # The only finding is the standing warning about the unit's restart policy.
    assert ids(report["planned"]) == {EXIT0}
    assert report["verdict"] == "warn"


def test_stable_profile_passes_once_the_restart_warning_is_acknowledged():
    accepted = [{"id": EXIT0, "reason": "the unit runs Restart=always and the watchdog checks progress"}]
    report = judge(ENTRIES, gpu(), None, plan(), accepted)
    assert report["verdict"] == "pass"
    assert report["warnings"] == [] and ids(report["accepted"]) == {EXIT0}


# --- version matching ----------------------------------------------------------------------

@pytest.mark.parametrize("cudnn", [
    "9.19.0.56",   # torch 2.11.0's pin (cu13 wheel)
    "9.19.0",      # what torch.backends.cudnn.version() reports for it
    "9.10.2.21",   # a cu12 wheel
    "9.9.0",       # '9.9.0' > '9.23.1' as strings: must still be affected
    "9.23.0",
    "9.23.0.99",
])
def test_cudnn_below_9_23_1_is_affected_on_sm120(cudnn):
    findings = evaluate(ENTRIES, gpu(), plan({"cudnn": cudnn}))
    finding = find(findings, CUDNN)
    assert finding["severity"] == "blocker"
    assert f"cudnn {cudnn} matches <9.23.1" in finding["matched"]
    assert "compute capability 12.0 (device 0)" in finding["matched"]


@pytest.mark.parametrize("cudnn", ["9.23.1", "9.23.1.0", "9.23.1.5", "9.24.0.43", "9.24.0", "10.0.0"])
def test_cudnn_9_23_1_and_later_is_not_affected(cudnn):
    assert CUDNN not in ids(evaluate(ENTRIES, gpu(), plan({"cudnn": cudnn})))


@pytest.mark.parametrize("cc, affected", [("12.0", True), ("12.1", True), ("10.0", False),
                                          ("9.0", False), ("8.9", False)])
def test_cudnn_issue_depends_on_compute_capability(cc, affected):
    findings = evaluate(ENTRIES, gpu(device(cc=cc)), plan({"cudnn": "9.19.0.56"}))
    assert (CUDNN in ids(findings)) is affected


def test_unknown_cudnn_version_does_not_match_and_is_reported():
    report = judge(ENTRIES, gpu(), None, plan({"cudnn": None}), [])
    assert CUDNN not in ids(report["planned"])
    assert any("unknown" in line and "cudnn" in line for line in report["summary"])


@pytest.mark.parametrize("cuda, vllm, blocked", [
    ("12.8", "0.25.1", True),
    ("12.9", "0.21.0", True),
    ("12.8", "0.26.0rc1", True),       # pre-releases are still CUDA 13 builds
    ("12.8", "0.25.1+cu130", True),
    ("13.0", "0.25.1", False),         # "13.0" is not "<13.0"
    ("13.1", "0.25.1", False),
    ("12.8", "0.20.2", False),
    ("12.8", None, False),             # unknown vLLM version: no match
    (None, "0.25.1", False),           # unknown driver CUDA version: no match
])
def test_cuda13_wheels_need_a_cuda13_driver(cuda, vllm, blocked):
    findings = evaluate(ENTRIES, gpu(cuda=cuda), plan({"vllm": vllm}))
    assert (CUDA13 in ids(findings)) is blocked
    if blocked:
        assert f"cuda_driver {cuda} matches <13.0" in find(findings, CUDA13)["matched"]


def test_nvidia_driver_version_comes_from_the_gpu_facts():
    catalogue = {"schema_version": 1, "known_issues": [dict(
        CATALOGUE_DOC["known_issues"][0], id="old-driver", match={"versions": {"nvidia_driver": "<575"}})]}
    entries = load_catalogue(catalogue)
    assert ids(evaluate(entries, gpu(driver="570.86.15"), plan())) == {"old-driver"}
    assert ids(evaluate(entries, gpu(driver="580.95.05"), plan())) == set()


# --- serve args and env --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["kv-cache-dtype", "--kv-cache-dtype", "kv_cache_dtype", "--kv_cache_dtype"])
def test_nvfp4_kv_cache_on_sm120_is_a_blocker_whatever_the_flag_spelling(name):
    p = plan()
    del p["serve_args"]["kv-cache-dtype"]
    p["serve_args"][name] = "nvfp4"
    report = judge(ENTRIES, gpu(), None, p, [])
    assert report["verdict"] == "block"
    assert ids(report["blockers"]) == {NVFP4_KV}
    assert 'serve arg kv-cache-dtype is "nvfp4" (in ["nvfp4"])' in report["blockers"][0]["matched"]


@pytest.mark.parametrize("cc, kv, matches", [("12.0", "fp8", False), ("12.1", "nvfp4", True),
                                              ("10.0", "nvfp4", False)])
def test_nvfp4_kv_cache_only_on_sm12x(cc, kv, matches):
    findings = evaluate(ENTRIES, gpu(device(cc=cc)), plan(serve_args={"kv-cache-dtype": kv}))
    assert (NVFP4_KV in ids(findings)) is matches


@pytest.mark.parametrize("value, matches", [(None, True), ("1", True), (1, True), ("0", False), (0, False)])
def test_deepgemm_e8m0_must_be_set_to_0(value, matches):
    p = plan()
    if value is None:
        del p["env"]["VLLM_USE_DEEP_GEMM_E8M0"]   # unset: vLLM's default is on
    else:
        p["env"]["VLLM_USE_DEEP_GEMM_E8M0"] = value
    findings = evaluate(ENTRIES, gpu(), p)
    assert (E8M0 in ids(findings)) is matches
    if value is None:
        assert 'env VLLM_USE_DEEP_GEMM_E8M0 is unset (not in ["0"])' in find(findings, E8M0)["matched"]


def test_deepgemm_e8m0_is_not_judged_off_sm12x():
    p = plan(env={"VLLM_USE_DEEP_GEMM_E8M0": "1"})
    assert E8M0 not in ids(evaluate(ENTRIES, gpu(device(cc="10.0")), p))


@pytest.mark.parametrize("value, matches", [(True, True), (False, False), ("true", False), ("True", False),
                                            (1, False)])
def test_enforce_eager_booleans_match_booleans_only(value, matches):
    findings = evaluate(ENTRIES, gpu(), plan(serve_args={"enforce-eager": value}))
    assert (EAGER in ids(findings)) is matches
    if matches:
        assert find(findings, EAGER)["severity"] == "warning"


@pytest.mark.parametrize("backend, matches", [("flashinfer_b12x", True), ("flashinfer-b12x", True),
                                               ("FLASHINFER_B12X", True), ("marlin", False), ("auto", False)])
def test_flashinfer_b12x_moe_backend_warns(backend, matches):
    report = judge(ENTRIES, gpu(), None, plan(serve_args={"--moe-backend": backend}), [])
    assert (B12X in ids(report["warnings"])) is matches
    assert report["verdict"] != "block"


def test_env_values_are_compared_as_strings():
    catalogue = {"schema_version": 1, "known_issues": [dict(
        CATALOGUE_DOC["known_issues"][0], id="flag-on", match={"env": {"FLAG": {"in": ["1", "True"]}}})]}
    entries = load_catalogue(catalogue)
    for value, matches in ((1, True), ("1", True), (True, True), ("true", False), (None, False)):
        assert (ids(evaluate(entries, gpu(), plan(env={"FLAG": value}))) == {"flag-on"}) is matches, value


def test_conflicting_spellings_of_one_flag_are_a_plan_error():
    p = plan(serve_args={"kv_cache_dtype": "nvfp4"})   # plan() already has kv-cache-dtype: fp8
    with pytest.raises(PlanError, match="'kv_cache_dtype' sets 'kv-cache-dtype' again"):
        evaluate(ENTRIES, gpu(), p)


# --- GPU health and several devices --------------------------------------------------------

@pytest.mark.parametrize("field, entry_id", [("retired_pages_pending", RETIRED),
                                             ("remapped_rows_pending", REMAP_PENDING),
                                             ("remapped_rows_failure", REMAP_FAILURE)])
def test_gpu_memory_faults_block_a_canary(field, entry_id):
    facts = gpu(device(0), device(1, **{field: True}), device(2, **{field: None}))
    report = judge(ENTRIES, facts, None, plan(), [])
    assert report["verdict"] == "block"
    finding = find(report["blockers"], entry_id)
    assert finding["devices"] == [1]
    assert f"{field} is true (in [true]) (device 1)" in finding["matched"]


def test_findings_list_the_matching_devices():
    facts = gpu(device(0, "12.0"), device(1, "9.0"), device(2, "12.0"), device(3, "12.1"))
    finding = find(evaluate(ENTRIES, facts, plan({"cudnn": "9.19.0.56"})), CUDNN)
    assert finding["devices"] == [0, 2, 3]
    assert "compute capability 12.0 (devices 0, 2)" in finding["matched"]
    assert "compute capability 12.1 (device 3)" in finding["matched"]


def test_node_wide_findings_name_every_device():
    facts = gpu(device(0), device(1, "9.0"), cuda="12.8")
    assert find(evaluate(ENTRIES, facts, plan()), CUDA13)["devices"] == [0, 1]


def test_no_matching_device_no_finding():
    facts = gpu(device(0, "9.0"), device(1, "10.0"))
    assert CUDNN not in ids(evaluate(ENTRIES, facts, plan({"cudnn": "9.19.0.56"})))


def test_gpu_facts_that_are_not_available_cannot_be_judged():
    facts = {"available": False, "error": "driver_not_loaded", "reason": "the NVIDIA driver is not loaded",
             "devices": [], "device_count": 0}
    with pytest.raises(PlanError, match="driver_not_loaded: the NVIDIA driver is not loaded"):
        judge(ENTRIES, facts, None, plan(), [])


# --- current versus planned ----------------------------------------------------------------

def test_current_findings_are_reported_but_never_block():
    current = plan({"cudnn": "9.19.0"}, env={"VLLM_USE_DEEP_GEMM_E8M0": "1"})
    report = judge(ENTRIES, gpu(), current, plan({"cudnn": "9.24.0.43"}), [])
    assert {CUDNN, E8M0} <= ids(report["current"])
    assert all(f["scope"] == "current" for f in report["current"])
    assert report["blockers"] == [] and report["verdict"] == "warn"
    assert CUDNN not in ids(report["planned"])
    assert any(line.startswith(f"current blocker {CUDNN}") and "fixed by the planned config" in line
               for line in report["summary"])


def test_a_blocker_still_in_the_planned_config_blocks():
    report = judge(ENTRIES, gpu(), plan({"cudnn": "9.19.0"}), plan({"cudnn": "9.19.0.56"}), [])
    assert report["verdict"] == "block"
    assert ids(report["blockers"]) == {CUDNN}
    assert find(report["blockers"], CUDNN)["scope"] == "planned"
    assert any("still present in the planned config" in line for line in report["summary"])


# --- accepting risks -----------------------------------------------------------------------

def test_accepting_a_blocker_with_a_reason():
    reason = "canary only, CUDA graphs off for the bisect, watched by hand"
    report = judge(ENTRIES, gpu(), None, plan({"cudnn": "9.19.0.56"}), [{"id": CUDNN, "reason": reason}])
    assert report["verdict"] == "warn"
    assert report["blockers"] == []
    finding = find(report["accepted"], CUDNN)
    assert finding["accepted"] is True and finding["accepted_reason"] == reason
    assert find(report["planned"], CUDNN)["accepted"] is True


@pytest.mark.parametrize("name", RISKY_ENV)
def test_a_risky_env_name_blocks_whatever_its_value_unless_accepted(name):
    for value in ("/tmp/x.so", "", "0"):
        report = judge(ENTRIES, gpu(), None, plan(env={name: value}), [])
        assert report["verdict"] == "block" and ids(report["blockers"]) == {RISKY_ENV[name]}, (name, value)
    accepted = judge(ENTRIES, gpu(), None, plan(env={name: "1"}), [{"id": RISKY_ENV[name], "reason": "lab bisect"}])
    assert accepted["verdict"] == "warn" and accepted["blockers"] == []


def test_the_stable_env_and_a_harmless_name_block_nothing():  # negative control of the risky names
    report = judge(ENTRIES, gpu(), None, plan(env={"VLLM_USE_DEEP_GEMM_E8M0": "0", "VLLM_LOGGING_LEVEL": "INFO"}), [])
    assert report["blockers"] == []


def test_accepting_one_blocker_leaves_the_others_blocking():
    p = plan({"cudnn": "9.19.0.56"}, serve_args={"kv-cache-dtype": "nvfp4"})
    report = judge(ENTRIES, gpu(), None, p, [{"id": CUDNN, "reason": "bisecting"}])
    assert report["verdict"] == "block"
    assert ids(report["blockers"]) == {NVFP4_KV}


def test_an_acceptance_that_matches_nothing_is_reported():
    report = judge(ENTRIES, gpu(), None, plan(), [{"id": NVFP4_KV, "reason": "old ticket"}])
    assert any(f"accepted risk {NVFP4_KV} does not match" in line for line in report["summary"])


def test_accepting_an_unknown_id_is_an_error():
    with pytest.raises(ValueError, match="id 'cudnn-typo' is not in the known-issues catalogue"):
        judge(ENTRIES, gpu(), None, plan(), [{"id": "cudnn-typo", "reason": "because"}])


@pytest.mark.parametrize("reason", [None, "", "   "])
def test_accepting_without_a_reason_is_an_error(reason):
    with pytest.raises(ValueError, match=f"\\(id '{CUDNN}'\\): a non-empty reason is required"):
        judge(ENTRIES, gpu(), None, plan(), [{"id": CUDNN, "reason": reason}])


def test_blocked_message_names_each_blocker_its_evidence_fix_and_how_to_accept():
    p = plan({"cudnn": "9.19.0.56"}, serve_args={"kv-cache-dtype": "nvfp4"})
    message = blocked_message(judge(ENTRIES, gpu(), None, p, []))
    for entry in (e for e in ENTRIES if e.id in (CUDNN, NVFP4_KV)):
        assert f"[{entry.id}] {entry.title}" in message
        assert entry.fix in message
        assert entry.evidence[0] in message
    assert f'vllm_fleet_accepted_risks: [{{id: {CUDNN}, reason: "..."}}' in message


# --- bad plans -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad_plan, message", [
    (plan({"cudnn": "nine.twenty"}), "planned plan: versions.cudnn: 'nine.twenty' is not a valid version"),
    (plan({"cuda_driver": "13.0"}), "planned plan: versions.cuda_driver: comes from the GPU facts"),
    (plan({"cudnnn": "9.24.0.43"}), "planned plan: versions.cudnnn: 'cudnnn' is not one of: vllm, torch, cudnn"),
    ({"versions": {}, "serve-args": {}}, "planned plan: 'serve-args' is not one of: versions, serve_args, env"),
    ({"versions": ["9.24"]}, "planned plan: versions: ['9.24'] is not a mapping"),
])
def test_bad_plans_are_errors_that_say_where(bad_plan, message):
    with pytest.raises(PlanError) as err:
        judge(ENTRIES, gpu(), None, bad_plan, [])
    assert message in str(err.value)


def test_unparsable_gpu_fact_version_is_an_error():
    with pytest.raises(PlanError, match="gpu facts: cuda_driver_version: 'thirteen' is not a valid version"):
        evaluate(ENTRIES, gpu(cuda="thirteen"), plan())


def test_bad_current_plan_is_named_as_current():
    with pytest.raises(PlanError, match="current plan: versions.vllm: 'latest'"):
        judge(ENTRIES, gpu(), plan({"vllm": "latest"}), plan(), [])


# --- malformed catalogues ------------------------------------------------------------------

def broken(mutate):
    doc = copy.deepcopy(CATALOGUE_DOC)
    mutate(doc["known_issues"])
    return doc


def set_field(index, field, value):
    return lambda issues: issues[index].__setitem__(field, value)


def set_match(index, match):
    return set_field(index, "match", match)


@pytest.mark.parametrize("mutate, message", [
    (lambda issues: issues[0].pop("fix"),
     f"known_issues[0] (id '{CUDNN}'): field 'fix': is required"),
    (set_field(3, "severity", "fatal"),
     f"known_issues[3] (id '{EAGER}'): field 'severity': 'fatal' is not one of: blocker, warning"),
    (set_field(2, "id", CUDNN),
     f"known_issues[2] (id '{CUDNN}'): field 'id': '{CUDNN}' is a duplicate"),
    (set_field(1, "id", "NVFP4_kv"),
     "known_issues[1] (id 'NVFP4_kv'): field 'id': 'NVFP4_kv' is not allowed: lower-case letters"),
    (lambda issues: issues[4].pop("id"),
     "known_issues[4] (no id): field 'id': is required"),
    (set_match(0, {"versions": {"cudnn": "9.23.1"}}),
     f"known_issues[0] (id '{CUDNN}'): field 'match.versions.cudnn': '9.23.1' is not a valid PEP 440 specifier"),
    (set_match(0, {"versions": {"cudnn": "<<9.23.1"}}),
     "field 'match.versions.cudnn': '<<9.23.1' is not a valid PEP 440 specifier"),
    (set_match(0, {"driver": {"in": ["580"]}}),
     f"known_issues[0] (id '{CUDNN}'): field 'match.driver': unknown match key, allowed: "
     "compute_capability, versions, serve_args, env, gpu"),
    (set_match(0, {"versions": {"cublas": "<13"}}),
     "field 'match.versions.cublas': unknown version key, allowed: vllm, torch, cudnn, cuda_driver, nvidia_driver"),
    (set_match(1, {"serve_args": {"kv-cache-dtype": {"in": "nvfp4"}}}),
     "field 'match.serve_args.kv-cache-dtype.in': 'nvfp4' is not allowed: a non-empty list is required"),
    (set_match(1, {"serve_args": {"kv-cache-dtype": {"in": ["nvfp4"], "not_in": ["fp8"]}}}),
     "field 'match.serve_args.kv-cache-dtype': {'in': ['nvfp4'], 'not_in': ['fp8']} is not a value matcher: "
     "exactly one of {in: [...]} or {not_in: [...]} is allowed"),
    (set_match(1, {"serve_args": {"kv-cache-dtype": {"equals": ["nvfp4"]}}}),
     "is not a value matcher"),
    (set_match(1, {"serve_args": {"kv-cache-dtype": "nvfp4"}}),
     "field 'match.serve_args.kv-cache-dtype': 'nvfp4' is not a value matcher"),
    (set_match(2, {"env": {"VLLM_USE_DEEP_GEMM_E8M0": {"not_in": [0]}}}),
     "field 'match.env.VLLM_USE_DEEP_GEMM_E8M0.not_in[0]': 0 is not allowed: environment values are strings"),
    (set_match(6, {"gpu": {"retired_pages": {"in": [True]}}}),
     f"known_issues[6] (id '{RETIRED}'): field 'match.gpu.retired_pages': not a device field of the GPU facts"),
    (set_match(0, {"compute_capability": [12.0]}),
     "field 'match.compute_capability[0]': 12.0 is not allowed: a quoted \"major.minor\" string"),
    (set_match(0, {}),
     f"known_issues[0] (id '{CUDNN}'): field 'match': {{}} is not allowed: a non-empty mapping is required"),
    (set_field(0, "evidence", []),
     f"known_issues[0] (id '{CUDNN}'): field 'evidence': [] is not allowed: a non-empty list of strings"),
    (set_field(0, "evidence", ["core dump", 48966]),
     "field 'evidence[1]': 48966 is not allowed: a non-empty string is required"),
    (set_field(0, "kernel_patterns", "cudnn_*"),
     "field 'kernel_patterns': 'cudnn_*' is not allowed: a non-empty list of strings"),
    (set_field(0, "severty", "blocker"),
     f"known_issues[0] (id '{CUDNN}'): field 'severty': unknown field, allowed: id, title, severity"),
    (lambda issues: issues.__setitem__(0, "cudnn is bad"),
     "known_issues[0]: 'cudnn is bad' is not allowed: an entry is a mapping"),
])
def test_malformed_catalogue_errors_name_the_entry_and_field(mutate, message):
    with pytest.raises(CatalogueError) as err:
        load_catalogue(broken(mutate))
    assert message in str(err.value)


@pytest.mark.parametrize("doc, message", [
    (dict(CATALOGUE_DOC, schema_version=2), "catalogue: field 'schema_version': 2 is not supported (supported: 1)"),
    ({"known_issues": []}, "catalogue: field 'schema_version': is required"),
    ({"schema_version": 1, "known_issues": []}, "catalogue: field 'known_issues': [] is not allowed"),
    ("catalogue/known_issues.yml", "the catalogue is a mapping with schema_version and known_issues"),
])
def test_malformed_catalogue_document(doc, message):
    with pytest.raises(CatalogueError) as err:
        load_catalogue(doc)
    assert message in str(err.value)


# --- core-dump triage ----------------------------------------------------------------------

def test_match_kernel_names_the_cudnn_entry():
    kernel = "cudnn_generated_fort_native_sm120_matMul_tile128x128_fusion_sm120"
    entry, pattern = match_kernel(ENTRIES, kernel)
    assert entry.id == CUDNN and fnmatch.fnmatchcase(kernel, pattern)
    assert match_kernel(ENTRIES, "cutlass_sm120_gemm_kernel") is None
    # Kernel names are case-sensitive.
    assert match_kernel(ENTRIES, kernel.upper()) is None
