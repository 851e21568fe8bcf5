"""The vllm-fleet CLI without a fleet: argument parsing and usage errors, the outcome and
exit-code logic over recorded runner stats and report files, the JUnit writer, the
progress formatter on events recorded from a real ansible-runner run, and the whole CLI
on small stand-in playbooks (local connection: no containers needed)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

import pytest

from vllm_fleet import cli, junit
from vllm_fleet.events import HostFacts, RunFacts, collect
from vllm_fleet.extravars import ExtraVarsError, parse_extra_vars
from vllm_fleet.outcome import PRECEDENCE, ExitCode, Reports, decide, read_reports
from vllm_fleet.progress import ProgressFormatter, clock

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
CUDNN_BLOCKER = "cudnn-sm12x-fusion-matmul-oob"


# ---------------------------------------------------------------- helpers

def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(list(argv), out=out)
    return code, out.getvalue()


def stats(**per_key: dict) -> dict:
    keys = ("ok", "changed", "dark", "failures", "ignored", "rescued", "skipped", "processed")
    result = {k: dict(per_key.get(k, {})) for k in keys}
    for key in ("ok", "changed", "dark", "failures", "skipped"):
        for host in result[key]:
            result["processed"].setdefault(host, 1)
    return result


def facts(stats_: dict | None, **hosts: HostFacts) -> RunFacts:
    return RunFacts(hosts=dict(hosts), stats=stats_)


def preflight_entry(host: str, verdict: str, message: str | None = None) -> dict:
    report = {"verdict": verdict, "blockers": [], "warnings": [], "summary": [f"verdict: {verdict}"]}
    if message:
        report["message"] = message
        report["blockers"] = [{"id": CUDNN_BLOCKER}]
    return {"host": host, "gpu": {"available": True}, "cudnn_current": {"status": "no_venv"},
            "release": {"vllm": "0.25.1", "torch": "2.11.0", "cudnn_package": "nvidia-cudnn-cu13",
                        "cudnn": "9.19.0.56" if verdict == "block" else "9.24.0.43"},
            "profile": "qwen3.6-35b-a3b-nvfp4-sm120", "report": report}


def write_reports(report_dir: Path, preflight: dict | None = None, rollout: dict | None = None) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    if preflight is not None:
        (report_dir / "preflight.json").write_text(json.dumps(preflight, indent=2))
    for host, data in (rollout or {}).items():
        (report_dir / "rollout").mkdir(exist_ok=True)
        (report_dir / "rollout" / f"{host}.json").write_text(json.dumps(data))
    return report_dir


def rollout_report(host: str, status: str, passed: bool | None, reasons=()) -> dict:
    soak = None if passed is None else {"passed": passed, "reasons": list(reasons), "duration_s": 3000}
    return {"host": host, "status": status, "release": "vllm0.25.1-cudnn9.24.0.43", "soak": soak}


def check_junit_schema(root: ET.Element) -> None:
    """The rules of the common JUnit schema (Jenkins junit-10.xsd) that CI readers rely on."""
    assert root.tag == "testsuites"
    for suite in root.findall("testsuite"):
        for attr in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp"):
            assert attr in suite.attrib, attr
        assert "+" not in suite.get("timestamp") and "Z" not in suite.get("timestamp")
        order = [child.tag for child in suite]
        allowed = ["properties", "testcase", "system-out", "system-err"]
        assert order == sorted(order, key=allowed.index), order
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            assert int(suite.get(attr)) == sum(c.find(tag) is not None for c in cases)
        for prop in suite.iter("property"):
            assert set(prop.attrib) == {"name", "value"}
        for case in cases:
            assert {"name", "classname", "time"} <= set(case.attrib)
            float(case.get("time"))
            outcomes = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
            assert len(outcomes) <= 1
            for child in case:
                assert child.tag in ("failure", "error", "skipped", "system-out", "system-err")
                if child.tag in ("failure", "error"):
                    assert "message" in child.attrib and "type" in child.attrib
    totals = root.findall("testsuite")
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in totals)


def parse_junit(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    check_junit_schema(root)
    return root


def cases_by_name(root: ET.Element) -> dict[str, ET.Element]:
    return {c.get("name"): c for c in root.iter("testcase")}


# ---------------------------------------------------------------- --extra-vars

def test_extra_vars_read_like_ansible_playbook(tmp_path):
    (tmp_path / "plan.yml").write_text("vllm_fleet_release:\n  cudnn: 9.24.0.43\nwhen: 2026-01-02\n")
    (tmp_path / "plan.json").write_text('{"b": [1, 2]}')
    merged = parse_extra_vars(
        ["a=1 b='two words'", '{"b": {"x": 1}, "c": true}', "{c: false}",
         "@plan.yml", f"@{tmp_path / 'plan.json'}"], project_dir=ROOT, cwd=tmp_path)
    assert merged == {"a": "1", "b": [1, 2], "c": False,
                      "vllm_fleet_release": {"cudnn": "9.24.0.43"}, "when": "2026-01-02"}


@pytest.mark.parametrize("value, named", [
    ("garbage", "'garbage'"),
    ("a=1 garbage", "'garbage'"),
    ('{"vllm_fleet_release": {"cudnn": "9.19"', "not valid JSON/YAML"),
    ("[1, 2]", "expected a mapping"),
    ("@missing.yml", "missing.yml"),
    ("", "empty value"),
    ("a='unclosed", "No closing quotation"),
    ("1bad=x", "'1bad=x'"),
    # The roles' own names: -e wins over every variable, so one could switch a check off.
    ("_key_is_bad=false", "'_key_is_bad' begins with '_'"),
    ('{"_instances_ok": true}', "'_instances_ok' begins with '_'"),
    ("@private.yml", "'_failing' begins with '_'"),
    # The strict loader: aliases, duplicate keys, over-long numbers.
    ("@bomb.yml", "an anchor (&a) is not allowed"),
    ("{a: 1, a: 2}", "duplicate key 'a'"),
    ("{n: " + "9" * 5000 + "}", "a number too long to read"),
    ("@long.yml", "a number too long to read"),
])
def test_malformed_extra_vars_are_named(tmp_path, value, named):
    (tmp_path / "private.yml").write_text("vllm_fleet_soak_duration_s: 60\n_failing: []\n")
    (tmp_path / "bomb.yml").write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n'
                                       'b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n')
    (tmp_path / "long.yml").write_text("vllm_fleet_soak_duration_s: " + "1" * 5000 + "\n")
    with pytest.raises(ExtraVarsError) as err:
        parse_extra_vars([value], project_dir=ROOT, cwd=tmp_path)
    assert named in str(err.value)
    assert str(err.value).startswith("--extra-vars")


def test_extra_vars_yaml_is_read_by_the_collections_strict_loader(tmp_path):
    """Negative control of the alias and private-name cases above: the same values without
    what is refused load, and PyYAML's safe_load (what the CLI used) takes the bomb."""
    import yaml
    (tmp_path / "plain.yml").write_text('a: ["x","x"]\nb: [["x","x"],["x","x"]]\n')
    assert parse_extra_vars(["@plain.yml", "{n: 12}", "public=1"], project_dir=ROOT, cwd=tmp_path) == {
        "a": ["x", "x"], "b": [["x", "x"], ["x", "x"]], "n": 12, "public": "1"}
    assert len(yaml.safe_load('a: &a [1, 2]\nb: [*a, *a]\n')["b"]) == 2


def test_variables_the_cli_sets_itself_are_refused():
    with pytest.raises(ExtraVarsError, match="vllm_fleet_report_dir is set by vllm-fleet itself; use --artifacts"):
        parse_extra_vars(["vllm_fleet_report_dir=/tmp/x"], project_dir=ROOT,
                         reserved={"vllm_fleet_report_dir": "--artifacts"})


# ---------------------------------------------------------------- usage errors (exit 2)

@pytest.fixture
def inventory(tmp_path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(f"all:\n  hosts:\n    alpha: {{ansible_connection: local, ansible_python_interpreter: {PYTHON}}}\n")
    return path


@pytest.mark.parametrize("argv, named", [
    ([], "the following arguments are required: COMMAND"),
    (["deploy"], "invalid choice: 'deploy'"),
    (["preflight", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["preflight", "-e", "garbage"], "--extra-vars 'garbage'"),
    (["preflight", "-e", '{"a": '], "--extra-vars '{\"a\": '"),
    (["preflight", "-e", "@/nonexistent/vars.yml"], "/nonexistent/vars.yml"),
    (["preflight", "-e", "vllm_fleet_report_dir=/tmp"], "vllm_fleet_report_dir is set by vllm-fleet itself"),
    (["preflight", "-i", "/nonexistent/hosts.yml"], "--inventory /nonexistent/hosts.yml: no such file"),
    (["preflight", "--limit", " "], "--limit: empty pattern"),
    (["coredumps"], "the following arguments are required: action"),
    (["coredumps", "explode"], "invalid choice: 'explode'"),
])
def test_usage_errors_exit_2_and_name_the_bad_input(argv, named, inventory, capsys):
    if "-i" not in argv and argv[:1] in (["preflight"], ["coredumps"]):
        argv = [*argv, "-i", str(inventory)]
    code, out = run_cli(*argv)
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE == 2
    assert named in err
    assert err.startswith("vllm-fleet: error:")
    assert "Traceback" not in err + out
    assert "--help" in err


def test_a_playbook_that_does_not_exist_is_a_usage_error(tmp_path, inventory, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "ansible.cfg").write_text("[defaults]\n")
    code, _ = run_cli("rollback", "--project-dir", str(project), "-i", str(inventory))
    assert code == 2
    assert "rollback: playbook playbooks/rollback.yml does not exist" in capsys.readouterr().err


def test_project_dir_without_ansible_cfg_is_a_usage_error(tmp_path, inventory, capsys):
    code, _ = run_cli("preflight", "--project-dir", str(tmp_path), "-i", str(inventory))
    assert code == 2
    assert "no ansible.cfg there" in capsys.readouterr().err


def test_default_inventory_comes_from_the_project_ansible_cfg(tmp_path, capsys):
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "playbooks" / "preflight.yml").write_text("---\n")
    (project / "ansible.cfg").write_text("[defaults]\ninventory = ./inventory/hosts.yml  ; the fleet\n")
    code, _ = run_cli("preflight", "--project-dir", str(project))
    assert code == 2
    assert f"the ansible.cfg inventory {project / 'inventory' / 'hosts.yml'} does not exist" in capsys.readouterr().err


def test_a_used_artifacts_dir_is_refused(tmp_path, inventory, capsys):
    used = tmp_path / "run"
    used.mkdir()
    (used / "summary.json").write_text("{}")
    code, _ = run_cli("preflight", "-i", str(inventory), "--artifacts", str(used))
    assert code == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_usage_errors_still_write_the_json_and_junit(tmp_path, inventory, capsys):
    summary_path, junit_path = tmp_path / "out" / "summary.json", tmp_path / "out" / "junit.xml"
    code, _ = run_cli("preflight", "-i", str(inventory), "-e", "garbage",
                      "--json", str(summary_path), "--junit", str(junit_path))
    assert code == 2
    summary = json.loads(summary_path.read_text())
    assert (summary["outcome"], summary["exit_code"], summary["command"]) == ("usage_error", 2, "preflight")
    assert "'garbage'" in summary["message"]
    assert summary["hosts"] == {}
    root = parse_junit(junit_path)
    [case] = root.iter("testcase")
    assert case.find("error").get("type") == "usage_error"
    assert "'garbage'" in case.find("error").get("message")
    # argparse's own errors too (the option parser never finished)
    code, _ = run_cli("preflight", "--bogus", "--json", str(summary_path), "--junit", str(junit_path))
    assert code == 2
    assert json.loads(summary_path.read_text())["outcome"] == "usage_error"
    assert "--bogus" in parse_junit(junit_path).find(".//error").get("message")


def test_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for line in ("0  success", "1  any other failure", "2  usage error", "3  preflight blocked",
                 "4  a gate failed: a host failed its soak", "5  unreachable", "2, then 4, then 3, then 5, then 1"):
        assert line in text
    for command in ("preflight", "rollout", "rollback", "coredumps"):
        assert command in text


def test_console_script_is_installed():
    script = Path(PYTHON).parent / "vllm-fleet"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("vllm-fleet "), result.stderr
    result = subprocess.run([str(script), "preflight", "-e", "garbage"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "'garbage'" in result.stderr and "Traceback" not in result.stderr


def test_commands_map_to_the_playbooks():
    assert {name: playbook for name, (playbook, _) in cli.COMMANDS.items()} == {
        "preflight": "playbooks/preflight.yml", "rollout": "rollout.yml",
        "rollback": "playbooks/rollback.yml", "coredumps": "playbooks/coredump.yml",
        "verify": "playbooks/verify.yml"}
    assert (ROOT / "playbooks" / "preflight.yml").is_file()


# ---------------------------------------------------------------- outcome and exit codes

def test_precedence_is_usage_gate_block_unreachable_failed():
    assert [int(c) for c in PRECEDENCE] == [2, 4, 3, 5, 1]


def test_success(tmp_path):
    reports = read_reports(write_reports(tmp_path / "r", preflight={
        "n1": preflight_entry("n1", "pass"), "n2": preflight_entry("n2", "warn")}))
    d = decide(facts(stats(ok={"n1": 8, "n2": 8})), reports, rc=0, status="successful")
    assert (d.exit_code, d.outcomes) == (0, ["success"])
    assert d.hosts["n1"]["status"] == d.hosts["n2"]["status"] == "ok"
    assert d.hosts["n2"]["preflight_verdict"] == "warn"  # warn is a success
    assert d.hosts["n1"]["release"]["cudnn"] == "9.24.0.43"
    assert d.hosts["n1"]["failed_task"] is d.hosts["n1"]["message"] is None


def test_preflight_block(tmp_path):
    reports = read_reports(write_reports(tmp_path / "r", preflight={
        "n1": preflight_entry("n1", "block", f"preflight blocked the rollout\n[{CUDNN_BLOCKER}] ..."),
        "n2": preflight_entry("n2", "warn")}))
    run = facts(stats(ok={"n1": 8, "n2": 9}, failures={"n1": 1}),
                n1=HostFacts(failed_task="preflight : Fail a node", failed_message="preflight blocked the rollout"))
    d = decide(run, reports, rc=2, status="failed")
    assert (d.exit_code, d.outcomes) == (3, ["preflight_blocked"])
    assert d.hosts["n1"]["status"] == "blocked" and d.hosts["n2"]["status"] == "ok"
    assert CUDNN_BLOCKER in d.hosts["n1"]["message"]
    assert d.hosts["n1"]["failed_task"] == "preflight : Fail a node"
    assert d.message == "preflight blocked: n1"


def test_gate_failed_from_the_rollout_reports(tmp_path):
    reports = read_reports(write_reports(tmp_path / "r", rollout={
        "canary": rollout_report("canary", "rolled_back", False, ["engine died at 23 min", "0 tokens in 60 s"]),
    }))
    run = facts(stats(ok={"canary": 30}, changed={"canary": 6}, failures={"canary": 1}),
                canary=HostFacts(failed_task="rollout : Halt", failed_message="soak gate failed"))
    d = decide(run, reports, rc=2, status="failed")
    assert (d.exit_code, d.outcomes) == (4, ["gate_failed"])
    host = d.hosts["canary"]
    assert (host["status"], host["soak_verdict"], host["release"]) == \
        ("rolled_back", "failed", "vllm0.25.1-cudnn9.24.0.43")
    assert host["message"] == "engine died at 23 min; 0 tokens in 60 s"


def test_gate_failed_even_when_the_playbook_itself_succeeded(tmp_path):
    """The reports are the truth: a rollout that halts cleanly after a rollback is still 4."""
    reports = read_reports(write_reports(tmp_path / "r", rollout={
        "canary": rollout_report("canary", "rolled_back", False, ["crash"]),
        "n2": rollout_report("n2", "skipped", None)}))
    d = decide(facts(stats(ok={"canary": 30, "n2": 1})), reports, rc=0, status="successful")
    assert d.exit_code == 4
    assert d.hosts["n2"]["status"] == "skipped" and d.hosts["n2"]["soak_verdict"] is None


def test_rollout_success_and_hosts_without_a_report_use_the_runner_stats(tmp_path):
    reports = read_reports(write_reports(tmp_path / "r", rollout={
        "canary": rollout_report("canary", "upgraded", True),
        "n2": rollout_report("n2", "upgraded", True)}))
    d = decide(facts(stats(ok={"canary": 30, "n2": 30, "lb": 4}, changed={"canary": 5, "n2": 5, "lb": 2})),
               reports, rc=0, status="successful")
    assert d.exit_code == 0
    assert d.hosts["canary"]["status"] == "upgraded" and d.hosts["canary"]["soak_verdict"] == "passed"
    assert d.hosts["lb"]["status"] == "changed"  # no report file: from the runner's stats


def test_a_node_the_rollback_playbook_reverted_is_a_success(tmp_path):
    reports = read_reports(write_reports(tmp_path / "r", rollout={
        "n1": rollout_report("n1", "reverted", None), "n2": rollout_report("n2", "skipped", None)}))
    d = decide(facts(stats(ok={"n1": 20, "n2": 5}, changed={"n1": 4})), reports, rc=0, status="successful")
    assert d.exit_code == 0
    assert (d.hosts["n1"]["status"], d.hosts["n2"]["status"]) == ("reverted", "skipped")


def test_a_rollback_that_was_not_the_soak_gate_is_another_failure(tmp_path):
    """The report's shape as the rollout_node role writes it, for a node whose drain failed."""
    reports = read_reports(write_reports(tmp_path / "r", rollout={"n1": {
        "host": "n1", "status": "rolled_back", "target": "r2", "previous": "r1", "release": "r1", "soak": None,
        "failed_task": "Wait until the node's in-flight requests finish", "message": "timed out after 600 s",
        "started": "2026-12-02T15:00:00+00:00", "finished": "2026-12-02T15:11:00+00:00"}}))
    run = facts(stats(ok={"n1": 20}, changed={"n1": 2}, failures={"n1": 1}),
                n1=HostFacts(failed_task="rollout_node : Halt the rollout", failed_message="rollout halted at n1"))
    d = decide(run, reports, rc=2, status="failed")
    assert (d.exit_code, d.outcomes, d.message) == (1, ["failed"], "rolled back: n1")
    assert d.hosts["n1"] | {"duration_s": 0} == {
        "status": "rolled_back", "release": "r1", "preflight_verdict": None, "soak_verdict": None,
        "failed_task": "Wait until the node's in-flight requests finish", "message": "timed out after 600 s",
        "duration_s": 0}


def test_a_failed_report_without_a_failed_soak_is_another_failure(tmp_path):
    reports = read_reports(write_reports(tmp_path / "r", rollout={
        "n1": {"host": "n1", "status": "failed", "release": "r1", "soak": None, "message": "pip could not resolve"}}))
    d = decide(facts(stats(ok={"n1": 3}, failures={"n1": 1})), reports, rc=2, status="failed")
    assert (d.exit_code, d.outcomes) == (1, ["failed"])
    assert d.hosts["n1"]["status"] == "failed" and d.hosts["n1"]["message"] == "pip could not resolve"


def test_unreachable():
    run = facts(stats(ok={"n1": 8, "ghost": 2}, dark={"ghost": 1}),
                ghost=HostFacts(unreachable_task="preflight : Gather GPU facts",
                                unreachable_message="Connection refused"))
    d = decide(run, Reports(), rc=4, status="failed")
    assert (d.exit_code, d.outcomes) == (5, ["unreachable"])
    assert d.hosts["ghost"] | {"duration_s": 0} == {
        "status": "unreachable", "release": None, "preflight_verdict": None, "soak_verdict": None,
        "failed_task": "preflight : Gather GPU facts", "message": "Connection refused", "duration_s": 0}


def test_a_node_lost_after_its_drain_is_unreachable_with_its_reports_words(tmp_path):
    # Its rescue's probe was an ignored unreachable (no "dark" in the recap) and its halt a
    # failure: the report's status decides, and the report says where HAProxy left it.
    reports = read_reports(write_reports(tmp_path / "r", rollout={
        "n1": {"host": "n1", "status": "unreachable", "release": None, "soak": None,
               "failed_task": "Fail the gate, the node stopped answering",
               "message": "n1 stopped answering during its soak", "lb_state": "n1 DRAIN/DOWN"}}))
    run = facts(stats(ok={"n1": 40}, failures={"n1": 1}),
                n1=HostFacts(failed_task="Halt the rollout", failed_message="rollout halted at n1",
                             unreachable_task="Read the soak's progress", unreachable_message="timed out"))
    d = decide(run, reports, rc=2, status="failed")
    assert (d.exit_code, d.outcomes) == (5, ["unreachable"])
    assert d.hosts["n1"]["status"] == "unreachable"
    assert d.hosts["n1"]["message"] == "n1 stopped answering during its soak"
    assert d.hosts["n1"]["failed_task"] == "Fail the gate, the node stopped answering"
    assert d.hosts["n1"]["soak_verdict"] is None  # not a failed gate: no exit 4


def test_other_failure():
    run = facts(stats(ok={"n1": 3, "n2": 4}, failures={"n1": 1}),
                n1=HostFacts(failed_task="vllm_runtime : Install", failed_message="No matching distribution"))
    d = decide(run, Reports(), rc=2, status="failed")
    assert (d.exit_code, d.outcomes, d.message) == (1, ["failed"], "failed: n1")
    assert d.hosts["n1"]["message"] == "No matching distribution"
    assert d.hosts["n2"]["status"] == "ok"


def test_a_run_that_broke_before_any_play_is_a_failure_with_ansibles_error():
    run = RunFacts(output=["[ERROR]: We were unable to read either as JSON nor YAML", "Origin: rollout.yml:3:1"])
    d = decide(run, Reports(), rc=4, status="failed")
    assert (d.exit_code, d.hosts) == (1, {})
    assert "unable to read either as JSON nor YAML" in d.message


def test_a_limit_that_matches_no_host_is_a_usage_error():
    run = RunFacts(output=["[WARNING]: Could not match supplied host pattern, ignoring: nosuch",
                           "[ERROR]: Specified inventory, host pattern and/or --limit leaves us with no hosts "
                           "to target."])
    d = decide(run, Reports(), rc=1, status="failed", limit="nosuch")
    assert (d.exit_code, d.message) == (2, "--limit 'nosuch' matches no host in the inventory")


def test_interrupted_and_timed_out_runs_fail():
    interrupted = decide(facts(None, n1=HostFacts()), Reports(), rc=254, status="canceled")
    assert (interrupted.exit_code, interrupted.message) == (1, "the run was interrupted")
    assert interrupted.hosts["n1"]["status"] == "unknown"  # no recap: no claim about the host
    assert decide(facts(None), Reports(), rc=254, status="timeout").message == "the run timed out"


def test_precedence_when_several_outcomes_apply(tmp_path):
    reports = read_reports(write_reports(
        tmp_path / "r",
        preflight={"b": preflight_entry("b", "block", "blocked"), "g": preflight_entry("g", "pass")},
        rollout={"g": rollout_report("g", "rolled_back", False, ["crash"])}))
    run = facts(stats(ok={"b": 1, "g": 9, "x": 2, "f": 3}, dark={"x": 1}, failures={"b": 1, "g": 1, "f": 1}))
    d = decide(run, reports, rc=2, status="failed")
    assert d.exit_code == 4
    assert d.outcomes == ["gate_failed", "preflight_blocked", "unreachable", "failed"]
    assert [d.hosts[h]["status"] for h in ("b", "g", "x", "f")] == ["blocked", "rolled_back", "unreachable", "failed"]
    # without the gate, the block wins over unreachable hosts; without both, unreachable wins
    del reports.rollout["g"]
    assert decide(run, reports, rc=2, status="failed").exit_code == 3
    assert decide(run, Reports(), rc=2, status="failed").exit_code == 5


def test_an_unreadable_report_is_never_a_success(tmp_path):
    report_dir = write_reports(tmp_path / "r")
    (report_dir / "rollout").mkdir()
    (report_dir / "rollout" / "n1.json").write_text("{half a report")
    reports = read_reports(report_dir)
    d = decide(facts(stats(ok={"n1": 3})), reports, rc=0, status="successful")
    assert d.exit_code == 1
    assert "unreadable report n1.json" in d.message
    assert reports.files == ["rollout/n1.json"]


# ---------------------------------------------------------------- JUnit

def summary_for(hosts: dict, outcome="success", exit_code=0, message="ok") -> dict:
    return {"command": "rollout", "playbook": "rollout.yml", "outcome": outcome, "exit_code": exit_code,
            "message": message, "limit": None, "artifacts": "/tmp/run", "started": "2026-12-02T15:00:00+00:00",
            "duration_s": 12.5, "hosts": hosts}


def host(status, message=None, **extra):
    return {"status": status, "release": "r1", "preflight_verdict": None, "soak_verdict": None,
            "failed_task": None, "message": message, "duration_s": 1.25, **extra}


def test_junit_one_testcase_per_host_with_the_right_counts(tmp_path):
    summary = summary_for({
        "up": host("upgraded", soak_verdict="passed"), "ok": host("ok"), "ch": host("changed"),
        "rb": host("rolled_back", "engine died at 23 min\nsecond line", soak_verdict="failed"),
        "bl": host("blocked", "preflight blocked"), "fa": host("failed", "boom"),
        "dark": host("unreachable", "Connection refused"), "sk": host("skipped"),
    }, outcome="gate_failed", exit_code=4)
    root = parse_junit(junit.write(summary, tmp_path / "j.xml"))
    suite = root.find("testsuite")
    assert suite.get("name") == "vllm-fleet rollout"
    counts = tuple(suite.get(k) for k in ("tests", "failures", "errors", "skipped"))
    assert counts == ("8", "3", "1", "1")
    assert suite.get("timestamp") == "2026-12-02T15:00:00"
    cases = cases_by_name(root)
    assert cases["rb"].find("failure").get("message") == "engine died at 23 min"
    assert cases["rb"].find("failure").text == "engine died at 23 min\nsecond line"
    assert cases["rb"].find("failure").get("type") == "rolled_back"
    assert cases["dark"].find("error").get("type") == "unreachable"
    assert cases["sk"].find("skipped") is not None
    assert all(cases[h].find("failure") is None and cases[h].find("error") is None for h in ("up", "ok", "ch"))
    assert {p.get("name"): p.get("value") for p in suite.iter("property")}["outcome"] == "gate_failed"


def test_junit_strips_colours_and_writes_out_what_xml_cannot_carry(tmp_path):
    summary = summary_for({"n1": host("failed", "\x1b[31mfatal\x1b[0m: \x00bad\x07 byte")}, "failed", 1)
    root = parse_junit(junit.write(summary, tmp_path / "j.xml"))
    assert root.find(".//failure").text == "fatal: \\x00bad\\x07 byte"


HOSTILE = "\udc80 \ud800x \x1b]0;owned\x07 \x1bP1$r\x1b\\ \x9b2J \x00 \ufffe"


def test_junit_is_valid_xml_whatever_the_text(tmp_path):
    # Reproduction: a lone surrogate (a non-UTF-8 name, decoded with surrogateescape) in a
    # message made junit.xml unparseable. Here in every field that reaches the file.
    summary = summary_for({f"n1{HOSTILE}": host("failed", f"boom {HOSTILE}\nsecond", failed_task=f"t {HOSTILE}"),
                           f"n2{HOSTILE}": host("skipped"), "n3": host(f"odd {HOSTILE}")},
                          f"failed{HOSTILE}", 1, f"run {HOSTILE}")
    path = junit.write(summary, tmp_path / "j.xml")
    root = ET.parse(path).getroot()  # parses: that is the point
    failure = root.find(".//failure")
    assert failure.text.startswith("boom \\udc80 \\ud800x  ") and failure.text.endswith("\\x00 \\ufffe\nsecond")
    assert "owned" not in ET.tostring(root, encoding="unicode")  # the OSC is gone, not shown
    check_junit_schema(root)


def test_progress_lines_carry_no_escape_sequence_nor_control(tmp_path):
    # Reproduction: an OSC sequence in a lease holder (through a task's msg) retitled the
    # operator's terminal; only CSI was stripped.
    import re
    event = {"event": "runner_on_failed", "created": "2026-12-02T15:00:00+00:00",
             "event_data": {"host": "lb01\x1b]0;x\x07",
                            "task": "Take the lock \x1b]8;;http://e\x1b\\here\x1b]8;;\x1b\\",
                            "res": {"msg": "held by run-a\x1b]0;rollout finished\x07 (user \x1bP+q\x1b\\deploy)\r"
                                           "forged line\x9b2J\x07\udc80 end"}}}
    lines = ProgressFormatter().format(event)
    text = "\n".join(lines)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]", text), ascii(text)
    assert "held by run-a (user deploy)" in lines[0] and "Take the lock here" in lines[0]
    assert lines[1].strip() == "forged line\\x07\\udc80 end"


def test_the_result_lines_carry_no_escape_sequence_nor_control():
    import re
    out = io.StringIO()
    cli._print_result(summary_for({f"n1{HOSTILE}": host("failed", f"boom {HOSTILE}\r\x1b[2Kforged")},
                                  "failed", 1, f"run {HOSTILE}\nsecond line"), out)
    text = out.getvalue()
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]", text), ascii(text)
    assert "run \\udc80" in text and "\nsecond line\n" in text
    [line] = [line for line in text.splitlines() if line.startswith("  n1")]
    assert line.endswith("boom \\udc80 \\ud800x    \\x00 \ufffe")  # the CR ends the first line


def test_progress_lines_keep_plain_text_and_strip_colours():  # negative control
    event = {"event": "runner_on_failed", "created": "2026-12-02T15:00:00+00:00",
             "event_data": {"host": "lb01", "task": "Take the lock",
                            "res": {"msg": "\x1b[31mheld\x1b[0m by run-a\tnow"}}}
    [line] = ProgressFormatter().format(event)
    assert line.endswith("lb01     FAILED       Take the lock | held by run-a\tnow")


def test_the_html_report_is_written_whatever_the_text(tmp_path):
    # A lone surrogate could not be written to the UTF-8 page (UnicodeEncodeError).
    from vllm_fleet import report as html_report
    summary = {"command": "rollout", "outcome": "failed", "exit_code": 1, "message": f"run {HOSTILE}",
               "hosts": {f"n1{HOSTILE}": {"status": "failed", "message": f"boom {HOSTILE}"}}}
    page = html_report.build_report(tmp_path, summary=summary).read_text(encoding="utf-8")
    assert "\\udc80" in page and "\x1b" not in page and "\x9b" not in page


def test_a_plain_extra_var_wins_over_a_vaulted_file_wherever_given_as_the_help_says(tmp_path, capsys):
    # What Ansible does with the order the CLI passes (ansible-runner puts the vaulted
    # -e @file of its cmdline before its own -e @env/extravars): a real run.
    from vllm_fleet.extravars import vault_files
    from vllm_fleet.runner import RunRequest, run
    password = tmp_path / "vault-pass"
    password.write_text("correct horse battery staple\n")
    vaulted = tmp_path / "vaulted.yml"
    vaulted.write_text("before: vaulted\nafter: vaulted\n")
    subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt", str(vaulted),
                    "--vault-password-file", str(password)], check=True, capture_output=True)
    (tmp_path / "play.yml").write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n"
                                       "        msg: 'before={{ before }} after={{ after }}'\n")
    argv = ["-e", "before=plain", "-e", f"@{vaulted}", "-e", "after=plain"]
    args = cli.build_parser().parse_args(["preflight", *argv, "--vault-password-file", str(password)])
    events: list[dict] = []
    result = run(RunRequest(project_dir=ROOT, playbook=tmp_path / "play.yml",
                            inventories=[local_inventory(tmp_path / "inv.json", {"localhost": {}})],
                            private_data_dir=tmp_path / "run", ident="order",
                            extravars=parse_extra_vars(args.extra_vars, project_dir=ROOT, cwd=tmp_path),
                            vault_files=vault_files(args.extra_vars, cwd=tmp_path), vault_password_files=[password]),
                 events.append)
    assert result.rc == 0
    said = [e["event_data"]["res"]["msg"] for e in events if e.get("event") == "runner_on_ok"]
    assert said == ["before=plain after=plain"]
    with pytest.raises(SystemExit):
        cli.main(["preflight", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("A vaulted @file goes to ansible-playbook before all of them, wherever it is given: a plain value wins "
            "over it") in help_text


def test_junit_a_failure_without_a_host_to_blame_gets_its_own_testcase(tmp_path):
    summary = summary_for({}, "failed", 1, "[ERROR]: rollout.yml could not be parsed")
    root = parse_junit(junit.write(summary, tmp_path / "j.xml"))
    [case] = root.iter("testcase")
    assert case.find("failure").get("message") == "[ERROR]: rollout.yml could not be parsed"
    # ... and a green run with no host is zero tests, not a failure
    root = parse_junit(junit.write(summary_for({}), tmp_path / "j2.xml"))
    assert root.get("tests") == "0"


# ---------------------------------------------------------------- progress, on recorded events

RECORDED_PLAY = """\
- name: Recorded play
  hosts: all
  gather_facts: false
  tasks:
    - name: Change something
      ansible.builtin.command: "true"
      changed_when: true
    - name: Progress of the soak
      ansible.builtin.debug:
        msg: "soak {{ item }}/3 min: 0 failures"
      loop: [1, 2, 3]
    - name: Summarise the node
      ansible.builtin.debug:
        msg: ["verdict: pass", "second line"]
    - name: Wait until it is ready
      ansible.builtin.command: "false"
      register: probe
      until: probe.rc == 0
      retries: 1
      delay: 0
      ignore_errors: true
      changed_when: false
    - name: Skip me
      ansible.builtin.debug:
        msg: never
      when: false
    - name: Loop with a failing item
      ansible.builtin.shell: "{{ item }}"
      loop: ["true", "echo it broke >&2; false"]
      changed_when: false
      when: host_fails | default(false)
"""


def local_inventory(path: Path, hosts: dict[str, dict]) -> Path:
    inv = {"all": {"hosts": {name: {"ansible_connection": "local", "ansible_python_interpreter": PYTHON, **vars_}
                             for name, vars_ in hosts.items()}}}
    path.write_text(json.dumps(inv))
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Events of one real ansible-runner run: two local hosts (one fails a loop item) and
    one that cannot be reached (ssh to a closed port)."""
    from vllm_fleet.runner import RunRequest, run

    tmp = tmp_path_factory.mktemp("recorded")
    (tmp / "play.yml").write_text(RECORDED_PLAY)
    inv = local_inventory(tmp / "inventory.json", {"alpha": {}, "beta": {"host_fails": True}})
    data = json.loads(inv.read_text())
    data["all"]["hosts"]["gamma"] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
    inv.write_text(json.dumps(data))
    events: list[dict] = []
    result = run(RunRequest(project_dir=ROOT, playbook=tmp / "play.yml", inventories=[inv],
                            private_data_dir=tmp / "run", ident="recorded"), events.append)
    return result, events


def test_recorded_events_make_one_readable_line_per_event_that_matters(recorded):
    result, events = recorded
    assert result.status == "failed"
    lines = [line for event in events for line in ProgressFormatter().format(event)]
    text = "\n".join(lines)
    assert lines[0].endswith("] PLAY Recorded play")
    assert any(line.split()[1:4] == ["alpha", "changed", "Change"] for line in lines)
    for n in (1, 2, 3):  # every soak progress line comes through, once per host
        assert sum(f"Progress of the soak | soak {n}/3 min: 0 failures" in line for line in lines) == 2
    summary = [i for i, line in enumerate(lines) if "alpha" in line and "Summarise the node | verdict: pass" in line]
    assert summary and lines[summary[0] + 1].strip() == "second line"
    retries = [line for line in lines if " retry " in line]
    assert len(retries) == 2 and all("Wait until it is ready | attempt 1/2: non-zero return code" in line
                                     for line in retries)
    assert any("gamma" in line and "UNREACHABLE" in line and "Connection refused" in line for line in lines)
    failed = [line for line in lines if "beta" in line and "FAILED" in line]
    assert "Loop with a failing item (item echo it broke >&2; false) | non-zero return code" in failed[0]
    assert "it broke" in text
    # quiet about what went fine or was expected to fail
    assert "ignored" not in text and "skipped" not in text.lower().split("recorded play")[-1]
    assert not any(" ok " in line for line in lines)
    assert all(line.startswith("[") or line.startswith(" ") for line in lines)


def test_verbose_progress_shows_ok_skipped_and_ignored(recorded):
    _, events = recorded
    formatter = ProgressFormatter(verbose=True)
    text = "\n".join(line for event in events for line in formatter.format(event))
    assert " ok " in text and "skipped      Skip me" in text and "ignored      Wait until it is ready" in text


def test_recorded_events_give_each_host_its_facts_and_outcome(recorded):
    result, events = recorded
    run = collect(events)
    assert set(run.hosts) == {"alpha", "beta", "gamma"}
    assert run.hosts["beta"].failed_task == "Loop with a failing item"
    assert "it broke" in run.hosts["beta"].failed_message  # the item's message, not "One or more items failed"
    assert run.hosts["gamma"].unreachable_task == "Change something"
    assert run.hosts["alpha"].failed_task is None  # its failure was ignored
    d = decide(run, Reports(), result.rc, result.status)
    assert (d.exit_code, d.outcomes) == (5, ["unreachable", "failed"])
    assert {h: v["status"] for h, v in d.hosts.items()} == \
        {"alpha": "changed", "beta": "failed", "gamma": "unreachable"}


def test_runner_artifacts_keep_no_credentials_from_the_environment(tmp_path):
    from vllm_fleet.runner import redact_command_env

    command = tmp_path / "command"
    env = {"CI_JOB_TOKEN": "s3cret", "HOME": "/root"}
    command.write_text(json.dumps({"command": ["ansible-playbook"], "env": env}))
    redact_command_env(command)
    assert json.loads(command.read_text())["env"] == {"CI_JOB_TOKEN": "<redacted>", "HOME": "/root"}


def test_runner_points_ansible_at_the_project(tmp_path):
    from vllm_fleet.runner import RunRequest, runner_kwargs

    request = RunRequest(project_dir=ROOT, playbook=ROOT / "rollout.yml",
                         inventories=[tmp_path / "a.yml", tmp_path / "b"],
                         private_data_dir=tmp_path / "run", ident="rollout", limit="canary",
                         extravars={"x": 1}, check=True)
    kwargs = runner_kwargs(request, lambda event: True)
    assert kwargs["inventory"] == [str(tmp_path / "a.yml"), str(tmp_path / "b")]  # a list: always paths
    assert (kwargs["playbook"], kwargs["project_dir"]) == (str(ROOT / "rollout.yml"), str(ROOT))
    assert (kwargs["limit"], kwargs["cmdline"], kwargs["quiet"], kwargs["ident"]) == \
        ("canary", "--check", True, "rollout")
    env = kwargs["envvars"]
    assert env["ANSIBLE_CONFIG"] == str(ROOT / "ansible.cfg")
    assert env["ANSIBLE_COLLECTIONS_PATH"] == str(ROOT / "collections")
    assert env["ANSIBLE_NOCOLOR"] == "1"
    assert env["PATH"].split(":")[0] == str(Path(PYTHON).parent)  # this environment's ansible-playbook


def test_clock_is_local_time_of_the_event():
    utc = datetime(2026, 12, 2, 15, 46, 38, tzinfo=timezone.utc)
    assert clock("2026-12-02T15:46:38.213935+00:00") == utc.astimezone().strftime("%H:%M:%S")


# ---------------------------------------------------------------- the whole CLI on stand-in playbooks

STANDIN_ROLLOUT = """\
- name: Roll out, one node at a time (a stand-in with the real report contract)
  hosts: all
  gather_facts: false
  serial: 1
  tasks:
    - name: Progress of the soak
      ansible.builtin.debug:
        msg: "soak {{ item }}/2 min: {{ 'engine died' if soak_fails | default(false) else 'healthy' }}"
      loop: [1, 2]
    - name: Make the rollout report directory
      ansible.builtin.file:
        path: "{{ vllm_fleet_report_dir }}/rollout"
        state: directory
        mode: "0755"
      delegate_to: localhost
    - name: Write the node's rollout report
      ansible.builtin.copy:
        dest: "{{ vllm_fleet_report_dir }}/rollout/{{ inventory_hostname }}.json"
        content: "{{ report | to_json }}"
        mode: "0644"
      delegate_to: localhost
      vars:
        report: "{{ {'host': inventory_hostname,
                     'status': 'rolled_back' if soak_fails | default(false) else 'upgraded',
                     'release': 'vllm0.25.1-cudnn9.24.0.43',
                     'soak': {'passed': not (soak_fails | default(false)),
                              'reasons': ['engine died at 23 min'] if soak_fails | default(false) else []}} }}"
    - name: Halt the rollout on a failed gate
      ansible.builtin.fail:
        msg: "soak gate failed on {{ inventory_hostname }}: rolled back"
      when: soak_fails | default(false)
"""
STANDIN_COREDUMP = """\
- name: Core dumps (a stand-in that echoes its action)
  hosts: all
  gather_facts: false
  tasks:
    - name: Progress
      ansible.builtin.debug:
        msg: "coredump action {{ vllm_fleet_coredump_action }}"
"""
STANDIN_PREFLIGHT = """\
- name: Preflight (a stand-in that fails one host's task)
  hosts: all
  gather_facts: false
  tasks:
    - name: Look at the node
      ansible.builtin.stat:
        path: /
    - name: Judge the node
      ansible.builtin.fail:
        msg: "judging {{ inventory_hostname }} broke"
      when: judge_fails | default(false)
"""


@pytest.fixture
def project(tmp_path) -> Path:
    """A project dir shaped like the checkout, with stand-in playbooks."""
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "collections").mkdir()
    (project / "plugins" / "module_utils").mkdir(parents=True)  # the CLI reads -e YAML with its loader
    (project / "plugins" / "module_utils" / "strict_yaml.py").symlink_to(ROOT / "plugins/module_utils/strict_yaml.py")
    (project / "ansible.cfg").write_text("[defaults]\ninventory = ./inventory.json\nretry_files_enabled = False\n")
    (project / "rollout.yml").write_text(STANDIN_ROLLOUT)
    (project / "playbooks" / "preflight.yml").write_text(STANDIN_PREFLIGHT)
    (project / "playbooks" / "coredump.yml").write_text(STANDIN_COREDUMP)
    return project


def test_cli_success_writes_summary_junit_and_artifacts(project, tmp_path):
    local_inventory(project / "inventory.json", {"canary": {}, "node2": {}})
    art = tmp_path / "run"
    code, out = run_cli("rollout", "--project-dir", str(project), "--artifacts", str(art),
                        "--json", str(tmp_path / "s.json"), "--junit", str(tmp_path / "j.xml"))
    assert code == 0, out
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary == json.loads((art / "summary.json").read_text())
    assert (summary["outcome"], summary["exit_code"], summary["rc"]) == ("success", 0, 0)
    assert summary["inventory"] == [str(project / "inventory.json")]  # the ansible.cfg default
    assert summary["playbook"] == "rollout.yml" and summary["artifacts"] == str(art)
    assert summary["reports"] == ["rollout/canary.json", "rollout/node2.json"]
    assert {h: (v["status"], v["soak_verdict"]) for h, v in summary["hosts"].items()} == \
        {"canary": ("upgraded", "passed"), "node2": ("upgraded", "passed")}
    assert summary["duration_s"] > 0 and summary["started"] <= summary["finished"]
    root = parse_junit(tmp_path / "j.xml")
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("2", "0", "0")
    assert (art / "junit.xml").read_text() == (tmp_path / "j.xml").read_text()
    assert (art / "artifacts" / "rollout" / "job_events").is_dir()
    assert (art / "artifacts" / "rollout" / "rc").read_text() == "0"
    assert "soak 2/2 min: healthy" in out
    assert "vllm-fleet rollout: success (exit 0)" in out


def test_cli_gate_failed_exits_4(project, tmp_path):
    local_inventory(project / "inventory.json", {"canary": {"soak_fails": True}, "node2": {}})
    code, out = run_cli("rollout", "--project-dir", str(project), "--artifacts", str(tmp_path / "run"),
                        "--junit", str(tmp_path / "j.xml"))
    assert code == ExitCode.GATE_FAILED == 4, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["outcome"], summary["outcomes"]) == ("gate_failed", ["gate_failed"])
    assert summary["hosts"]["canary"]["status"] == "rolled_back"
    assert summary["hosts"]["canary"]["message"] == "engine died at 23 min"
    assert "node2" not in summary["hosts"]  # the rollout halted before it
    assert "soak 2/2 min: engine died" in out
    failure = parse_junit(tmp_path / "j.xml").find(".//failure")
    assert (failure.get("type"), failure.get("message")) == ("rolled_back", "engine died at 23 min")


def test_cli_task_failure_exits_1_and_quiet_prints_only_the_result(project, tmp_path):
    local_inventory(project / "inventory.json", {"n1": {"judge_fails": True}, "n2": {}})
    code, out = run_cli("preflight", "--project-dir", str(project), "--artifacts", str(tmp_path / "run"), "-q")
    assert code == 1
    assert out.splitlines()[0] == "vllm-fleet preflight: failed (exit 1): failed: n1"
    assert "PLAY" not in out
    root = parse_junit(tmp_path / "run" / "junit.xml")
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("2", "1", "0")
    assert cases_by_name(root)["n1"].find("failure").get("message") == "judging n1 broke"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["hosts"]["n1"] | {"duration_s": 0} == {
        "status": "failed", "release": None, "preflight_verdict": None, "soak_verdict": None,
        "failed_task": "Judge the node", "message": "judging n1 broke", "duration_s": 0}


def test_cli_extra_vars_reach_the_playbook(project, tmp_path):
    local_inventory(project / "inventory.json", {"n1": {}})
    (tmp_path / "vars.yml").write_text("judge_fails: true\n")
    code, out = run_cli("preflight", "--project-dir", str(project), "--artifacts", str(tmp_path / "run"),
                        "-e", '{"judge_fails": false}', "-e", f"@{tmp_path / 'vars.yml'}", "-q")
    assert code == 1, out  # the later -e wins, as in ansible-playbook
    assert "judging n1 broke" in out


def test_cli_limit_that_matches_nothing_exits_2(project, tmp_path):
    local_inventory(project / "inventory.json", {"n1": {}})
    code, out = run_cli("preflight", "--project-dir", str(project), "--artifacts", str(tmp_path / "run"),
                        "--limit", "nosuch", "--junit", str(tmp_path / "j.xml"))
    assert code == 2, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["message"] == "--limit 'nosuch' matches no host in the inventory"
    assert parse_junit(tmp_path / "j.xml").find(".//error").get("type") == "usage_error"


def test_cli_unreachable_exits_5(project, tmp_path):
    inv = {"all": {"hosts": {"n1": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON},
                             "gone": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}}}}
    (tmp_path / "inv.json").write_text(json.dumps(inv))
    code, out = run_cli("preflight", "--project-dir", str(project), "-i", str(tmp_path / "inv.json"),
                        "--artifacts", str(tmp_path / "run"), "--junit", str(tmp_path / "j.xml"))
    assert code == 5, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {h: v["status"] for h, v in summary["hosts"].items()} == {"n1": "ok", "gone": "unreachable"}
    error = cases_by_name(parse_junit(tmp_path / "j.xml"))["gone"].find("error")
    assert error.get("type") == "unreachable" and "port 1" in error.text


def test_default_artifacts_dir_is_new_per_run(tmp_path):
    started = datetime(2026, 12, 2, 15, 0, 0, tzinfo=timezone.utc)
    first = cli._artifacts_dir(None, tmp_path, "rollout", started)
    second = cli._artifacts_dir(None, tmp_path, "rollout", started)
    assert first.parent == second.parent == tmp_path / "reports" / "runs"
    assert first != second and first.is_dir() and second.is_dir()
    assert first.name.endswith("-rollout") and second.name == first.name + "-2"


def test_cli_coredumps_passes_its_action_and_owns_the_variable(project, tmp_path, capsys):
    local_inventory(project / "inventory.json", {"n1": {}})
    code, out = run_cli("coredumps", "collect", "--project-dir", str(project), "--artifacts", str(tmp_path / "run"))
    assert code == 0, out
    assert "Progress | coredump action collect" in out
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["playbook"] == "playbooks/coredump.yml"
    code, _ = run_cli("coredumps", "collect", "--project-dir", str(project),
                      "-e", "vllm_fleet_coredump_action=enable")
    assert code == 2
    assert "vllm_fleet_coredump_action is set by vllm-fleet itself; use the coredumps action argument" \
        in capsys.readouterr().err


def test_cli_interrupted_run_exits_1_without_a_traceback(project, tmp_path):
    """Ctrl-C (SIGINT) cancels ansible-playbook cleanly and still writes the result."""
    import signal
    import time

    local_inventory(project / "inventory.json", {"n1": {}})
    (project / "playbooks" / "preflight.yml").write_text(
        "- name: Slow\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Sleep\n      ansible.builtin.command: sleep 60\n")
    proc = subprocess.Popen([str(Path(PYTHON).parent / "vllm-fleet"), "preflight", "--project-dir", str(project),
                             "--artifacts", str(tmp_path / "run"), "-v"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "run").glob("artifacts/preflight/job_events/*-*.json")) or \
                not any("runner_on_start" in p.read_text()
                        for p in (tmp_path / "run").glob("artifacts/preflight/job_events/*.json")):
            assert time.monotonic() < deadline and proc.poll() is None, "the run never started its task"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output
    assert "Traceback" not in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["outcome"], summary["message"]) == ("failed", "the run was interrupted")
    assert summary["hosts"]["n1"]["status"] == "unknown"
    assert summary["duration_s"] < 50


STANDIN_BLOCKING_PREFLIGHT = """\
- name: Preflight (a stand-in writing preflight.json in the real shape)
  hosts: all
  gather_facts: false
  tasks:
    - name: Keep the verdict for the report
      ansible.builtin.set_fact:
        vllm_fleet_preflight:
          host: "{{ inventory_hostname }}"
          release: {vllm: "0.25.1", cudnn: "{{ cudnn }}"}
          report:
            verdict: "{{ 'block' if cudnn == '9.19.0.56' else 'pass' }}"
            blockers: []
            warnings: []
            summary: ["verdict: {{ 'block' if cudnn == '9.19.0.56' else 'pass' }}"]
            message: "preflight blocked the rollout: [cudnn-sm12x-fusion-matmul-oob] on {{ inventory_hostname }}"
    - name: Write the preflight report on the controller
      ansible.builtin.copy:
        content: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars)
                     | map(attribute='vllm_fleet_preflight'))) | to_nice_json }}"
        dest: "{{ vllm_fleet_report_dir }}/preflight.json"
        mode: "0644"
      delegate_to: localhost
      run_once: true
    - name: Fail a node whose plan hits an unaccepted blocker
      ansible.builtin.fail:
        msg: "{{ vllm_fleet_preflight.report.message }}"
      when: vllm_fleet_preflight.report.verdict == 'block'
"""


def test_cli_preflight_block_exits_3(project, tmp_path):
    (project / "playbooks" / "preflight.yml").write_text(STANDIN_BLOCKING_PREFLIGHT)
    local_inventory(project / "inventory.json", {"sm120": {"cudnn": "9.19.0.56"}, "sm100": {"cudnn": "9.24.0.43"}})
    code, out = run_cli("preflight", "--project-dir", str(project), "--artifacts", str(tmp_path / "run"),
                        "--junit", str(tmp_path / "j.xml"))
    assert code == ExitCode.PREFLIGHT_BLOCKED == 3, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["outcome"], summary["reports"]) == ("preflight_blocked", ["preflight.json"])
    assert {h: (v["status"], v["preflight_verdict"]) for h, v in summary["hosts"].items()} == \
        {"sm120": ("blocked", "block"), "sm100": ("ok", "pass")}
    assert summary["hosts"]["sm120"]["release"] == {"vllm": "0.25.1", "cudnn": "9.19.0.56"}
    failure = parse_junit(tmp_path / "j.xml").find(".//failure")
    assert failure.get("type") == "blocked" and CUDNN_BLOCKER in failure.get("message")
