"""The preflight module, run end to end by ansible-playbook on localhost."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CATALOGUE = yaml.safe_load((ROOT / "catalogue" / "known_issues.yml").read_text())
CUDNN = "cudnn-sm12x-fusion-matmul-oob"

GPU = {
    "available": True, "error": None, "reason": None, "driver_version": "580.95.05",
    "cuda_driver_version": "13.0", "device_count": 1,
    "devices": [{"index": 0, "compute_capability": "12.0", "sm": "sm_120",
                 "retired_pages_pending": False, "remapped_rows_pending": False,
                 "remapped_rows_failure": False}],
}
STABLE = {
    "versions": {"vllm": "0.25.1", "torch": "2.11.0", "cudnn": "9.24.0.43"},
    "serve_args": {"kv-cache-dtype": "fp8", "enforce-eager": False},
    "env": {"VLLM_USE_DEEP_GEMM_E8M0": "0"},
}
OLD_CUDNN = copy.deepcopy(STABLE)
OLD_CUDNN["versions"]["cudnn"] = "9.19.0.56"
BAD_CATALOGUE = copy.deepcopy(CATALOGUE)
BAD_CATALOGUE["known_issues"][3]["severity"] = "fatal"

# One playbook run covers every case: each case is one task, its result saved by name.
CASES = {
    "blocked": {"planned": OLD_CUDNN, "current": OLD_CUDNN},
    "accepted": {"planned": OLD_CUDNN, "accept": [{"id": CUDNN, "reason": "canary bisect, watched by hand"}]},
    "report_only": {"planned": OLD_CUDNN, "fail_on_blocker": False},
    "stable": {"planned": STABLE, "current": OLD_CUDNN},
    "malformed_catalogue": {"planned": STABLE, "catalogue": BAD_CATALOGUE},
    "unknown_accept_id": {"planned": STABLE, "accept": [{"id": "no-such-issue", "reason": "why not"}]},
    "missing_reason": {"planned": STABLE, "accept": [{"id": CUDNN}]},
    "bad_version": {"planned": {**STABLE, "versions": {"cudnn": "nine"}}},
    "catalogue_as_path": {"planned": STABLE, "catalogue": "catalogue/known_issues.yml"},
}

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  vars_files: [cases.json]
  tasks:
    - name: Preflight
      vllm_fleet.fleet.preflight:
        catalogue: "{{ item.value.catalogue | default(catalogue) }}"
        gpu: "{{ gpu }}"
        current: "{{ item.value.current | default(omit) }}"
        planned: "{{ item.value.planned }}"
        accept: "{{ item.value.accept | default(omit) }}"
        fail_on_blocker: "{{ item.value.fail_on_blocker | default(omit) }}"
      loop: "{{ cases | dict2items }}"
      loop_control: {label: "{{ item.key }}"}
      check_mode: true   # it changes nothing, so check mode must give the same answers
      register: preflight
      ignore_errors: true

    - name: Save the results by case
      ansible.builtin.copy:
        content: "{{ dict(preflight.results | map(attribute='item.key') | zip(preflight.results)) | to_json }}"
        dest: "{{ results_path }}"
        mode: "0600"
      check_mode: false
"""


def run_playbook(tmp_path, cases, extra_env=None):
    (tmp_path / "cases.json").write_text(json.dumps({"catalogue": CATALOGUE, "gpu": GPU, "cases": cases}))
    (tmp_path / "playbook.yml").write_text(PLAYBOOK)
    results_path = tmp_path / "results.json"
    env = dict(os.environ, ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_NOCOLOR="1", **(extra_env or {}))
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"results_path={results_path}",
         str(tmp_path / "playbook.yml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr, json.loads(results_path.read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_playbook(tmp_path_factory.mktemp("preflight"), CASES)


@pytest.fixture(scope="module")
def results(run):
    return run[1]


def test_no_case_crashes_the_module(run):
    output, results = run
    assert set(results) == set(CASES)
    assert "Traceback" not in output
    for name, result in results.items():
        # ansible-core 2.19 records "(traceback unavailable)" for every fail_json without one.
        assert "Traceback" not in str(result.get("exception", "")), (name, result["exception"])
        assert "module_stderr" not in result, (name, result)
        assert result["changed"] is False, name


def test_blocked_rollout_fails_naming_the_id_evidence_fix_and_how_to_accept(results):
    result = results["blocked"]
    assert result["failed"] is True
    entry = next(e for e in CATALOGUE["known_issues"] if e["id"] == CUDNN)
    msg = result["msg"]
    assert f"[{CUDNN}] {entry['title']}" in msg
    assert " ".join(entry["fix"].split()) in " ".join(msg.split())
    assert "GPU core dump" in msg
    assert "vllm_fleet_accepted_risks:" in msg and f"id: {CUDNN}" in msg
    report = result["preflight"]
    assert report["verdict"] == "block"
    assert [f["id"] for f in report["blockers"]] == [CUDNN]
    assert CUDNN in [f["id"] for f in report["current"]]


def test_accepted_blocker_passes_with_the_reason_recorded(results):
    result = results["accepted"]
    assert not result.get("failed")
    report = result["preflight"]
    assert report["verdict"] == "warn"
    assert report["blockers"] == []
    [accepted] = report["accepted"]
    assert accepted["id"] == CUDNN and accepted["accepted_reason"] == "canary bisect, watched by hand"


def test_fail_on_blocker_false_reports_without_failing(results):
    result = results["report_only"]
    assert not result.get("failed")
    assert result["preflight"]["verdict"] == "block"


def test_stable_profile_is_not_blocked_and_reports_the_current_issue(results):
    result = results["stable"]
    assert not result.get("failed")
    report = result["preflight"]
    assert report["blockers"] == []
    assert CUDNN in [f["id"] for f in report["current"]]
    assert CUDNN not in [f["id"] for f in report["planned"]]


@pytest.mark.parametrize("case, message", [
    ("malformed_catalogue",
     "known_issues[3] (id 'enforce-eager-is-not-a-fix'): field 'severity': 'fatal' is not one of: blocker, warning"),
    ("unknown_accept_id", "id 'no-such-issue' is not in the known-issues catalogue"),
    ("missing_reason", "missing required arguments: reason"),
    ("bad_version", "planned plan: versions.cudnn: 'nine' is not a valid version"),
    ("catalogue_as_path", "the catalogue is a mapping with schema_version and known_issues"),
])
def test_bad_input_fails_with_a_clear_message(results, case, message):
    result = results[case]
    assert result["failed"] is True
    assert message in result["msg"]
    assert "preflight" not in result   # no report from input that could not be judged
