"""The fleet_monitoring role without a fleet: the real role (playbooks/monitoring.yml, local
connection) renders the targets and the rules for a composed inventory; Debian's promtool
checks the rules and runs tests/fixtures/prometheus/rules_test.yml against them (every alert
fires where it should and not where it should not). A second run changes nothing, check mode
writes nothing, bad settings are refused naming the variable."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_TEST = ROOT / "tests" / "fixtures" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "roles" / "fleet_monitoring" / "files" / "vllm-fleet-dashboard.json"
# What vLLM 0.25.1 exports (docs/DESIGN), and Prometheus's own per-target series.
VLLM_METRICS = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
                "vllm:prompt_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
                "vllm:request_success_total", "process_start_time_seconds", "up"}
FLEET = "vllm-fleet"
# Composed: a canary with the default instance, a two-GPU node, a node Prometheus reaches on
# IPv6, and the Prometheus host itself (group monitoring), which is not scraped.
INVENTORY = {"all": {
    "hosts": {
        "node01": {"ansible_host": "10.0.0.1"},
        "node02": {"ansible_host": "10.0.0.2", "vllm_fleet_instances": [
            {"name": "gpu0", "gpu": 0, "port": 8000}, {"name": "gpu1", "gpu": 1, "port": 8001}]},
        "node03": {"ansible_host": "10.0.0.3", "vllm_fleet_monitoring_scrape_address": "fd00::3"},
        "prom": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
    },
    "children": {"canary": {"hosts": {"node01": None}}, "fleet": {"hosts": {"node02": None, "node03": None}},
                 "monitoring": {"hosts": {"prom": None}}},
}}
ALERTS = {"VLLMInstanceDown", "VLLMEngineRestarted", "VLLMRestartBudgetSpent", "VLLMEngineWedged",
          "VLLMEngineWedgedNotRestarted", "VLLMKVCacheNearlyFull", "VLLMWaitingQueueGrowing"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: run scripts/setup-host.sh as root (Debian's prometheus)", pytrace=False)
    return path


def apply(tmp_path: Path, out: Path, *args: str, inventory: dict = INVENTORY, **extra) -> subprocess.CompletedProcess:
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_NOCOLOR": "1"}
    variables = {"vllm_fleet_monitoring_hosts": "monitoring", "vllm_fleet_monitoring_dir": str(out),
                 "vllm_fleet_monitoring_promtool": promtool(), "vllm_fleet_monitoring_reload_service": "", **extra}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.json"),
                           "playbooks/monitoring.yml", "-e", json.dumps(variables), *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=180, check=False)


def changed(proc: subprocess.CompletedProcess) -> int:
    recap = [line for line in proc.stdout.splitlines() if line.startswith("prom ")]
    assert recap, proc.stdout[-3000:]
    return int(recap[-1].split("changed=")[1].split()[0])


def promtool_test(out: Path) -> subprocess.CompletedProcess:
    shutil.copyfile(RULES_TEST, out / RULES_TEST.name)
    return subprocess.run([promtool(), "test", "rules", RULES_TEST.name], cwd=out, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("monitoring")
    out = tmp / "prometheus"
    proc = apply(tmp, out, vllm_fleet_monitoring_grafana_dashboard_dir=str(out / "dashboards"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return out


def test_the_targets_are_every_instance_of_every_node_and_not_the_prometheus_host(rendered):
    groups = json.loads((rendered / f"{FLEET}.targets.json").read_text())
    got = {(g["labels"]["node"], g["labels"]["vllm_instance"]): (g["targets"], g["labels"]) for g in groups}
    assert set(got) == {("node01", "gpu0"), ("node02", "gpu0"), ("node02", "gpu1"), ("node03", "gpu0")}
    assert got["node01", "gpu0"][0] == ["10.0.0.1:8000"]  # no instances of its own: fleet_defaults' default
    assert got["node02", "gpu1"] == (["10.0.0.2:8001"], {"fleet": FLEET, "node": "node02", "vllm_instance": "gpu1",
                                                         "gpu": "1", "unit": "vllm@gpu1.service"})
    assert got["node03", "gpu0"][0] == ["[fd00::3]:8000"]  # the scrape address wins over ansible_host


def test_promtool_checks_the_rules_and_every_alert_is_there(rendered):
    rules = rendered / f"{FLEET}.rules.yml"
    check = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    names = {r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]}
    assert names == ALERTS
    # Only the names vLLM 0.25.1 exports (gpu_cache_usage_perc is gone) and Prometheus's own.
    assert "gpu_cache_usage_perc" not in rules.read_text()


def test_promtool_unit_tests_fire_and_hold_every_alert(rendered):
    proc = promtool_test(rendered)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout[-6000:] + proc.stderr
    cases = [t for case in yaml.safe_load(RULES_TEST.read_text())["tests"] for t in case["alert_rule_test"]]
    assert {t["alertname"] for t in cases if t["exp_alerts"]} == ALERTS  # each fires somewhere ...
    assert {t["alertname"] for t in cases if not t["exp_alerts"]} == ALERTS  # ... and is silent somewhere


def metric_names(expr: str) -> set[str]:
    import re

    names = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_the_grafana_dashboard_has_its_panels_and_valid_queries_on_real_metric_names(rendered, tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert (rendered / "dashboards" / DASHBOARD.name).read_bytes() == DASHBOARD.read_bytes()  # the role wrote it
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in ("Tokens/s", "TTFT", "TPOT", "KV cache", "running and waiting", "restarts"):
        assert any(wanted in title for title in titles), (wanted, titles)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert set().union(*map(metric_names, exprs)) <= VLLM_METRICS
    # promtool parses every query (as a recording rule), with Grafana's variables filled in.
    filled = [e.replace("$__rate_interval", "1m").replace("$fleet", FLEET).replace("$node", ".*") for e in exprs]
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(filled)]}]}))
    check = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # Negative control: the same check refuses a query with a syntax error.
    rules.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [{"record": "d:q", "expr": filled[0][:-1]}]}]}))
    assert subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, timeout=60).returncode != 0


def test_the_rules_read_only_metrics_vllm_exports(rendered):
    rules = yaml.safe_load((rendered / f"{FLEET}.rules.yml").read_text())
    used = set().union(*(metric_names(r["expr"]) for g in rules["groups"] for r in g["rules"]))
    assert used <= VLLM_METRICS, used - VLLM_METRICS
    assert {"vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc", "up"} <= used


def test_the_rule_tests_catch_a_wrong_threshold(tmp_path):
    """Negative control: rules whose KV threshold is 0.93 fire for the node at 94%, and the
    rule tests say so."""
    out = tmp_path / "prometheus"
    proc = apply(tmp_path, out, vllm_fleet_monitoring_kv_cache_threshold=0.93)
    assert proc.returncode == 0, proc.stdout[-3000:]
    test = promtool_test(out)
    said = test.stdout + test.stderr
    assert test.returncode != 0
    assert "alertname: VLLMKVCacheNearlyFull" in said and 'node="node02"' in said, said[-4000:]


def test_a_second_run_changes_nothing_and_check_mode_writes_nothing(rendered, tmp_path):
    again = apply(tmp_path, rendered, vllm_fleet_monitoring_grafana_dashboard_dir=str(rendered / "dashboards"))
    assert again.returncode == 0 and changed(again) == 0, again.stdout[-3000:]
    before = {p.name: p.read_bytes() for p in rendered.iterdir() if p.is_file()}
    check = apply(tmp_path, rendered, "--check", "--diff", vllm_fleet_monitoring_wedge_for="3m",
                  vllm_fleet_monitoring_grafana_dashboard_dir=str(rendered / "dashboards"))
    assert check.returncode == 0 and changed(check) == 1, check.stdout[-3000:]  # the rules would change ...
    assert "for: 3m" in check.stdout
    assert {p.name: p.read_bytes() for p in rendered.iterdir() if p.is_file()} == before  # ... and did not


def test_a_budget_of_zero_leaves_the_budget_alert_out(tmp_path):
    out = tmp_path / "prometheus"
    proc = apply(tmp_path, out, vllm_fleet_monitoring_restart_budget=0)
    assert proc.returncode == 0, proc.stdout[-3000:]
    names = {r["alert"] for g in yaml.safe_load((out / f"{FLEET}.rules.yml").read_text())["groups"] for r in g["rules"]}
    assert names == ALERTS - {"VLLMRestartBudgetSpent"}


BAD = {
    "duration": ({"vllm_fleet_monitoring_wedge_for": "5 minutes"}, None,
                 ["vllm_fleet_monitoring_wedge_for", '"5 minutes"', "not a Prometheus duration"]),
    "fleet-name": ({"vllm_fleet_monitoring_fleet_name": "../etc"}, None,
                   ["vllm_fleet_monitoring_fleet_name", "../etc", "is not a fleet name"]),
    "kv-threshold": ({"vllm_fleet_monitoring_kv_cache_threshold": 95}, None,
                     ["vllm_fleet_monitoring_kv_cache_threshold must be a fraction from 0 to 1", "got 95"]),
    "unknown-node": ({"vllm_fleet_monitoring_nodes": ["node01", "node99"]}, None,
                     ["vllm_fleet_monitoring_nodes", "not in the inventory: node99"]),
    "bad-port": ({}, ("node02", [{"name": "gpu0", "gpu": 0, "port": "80; rm"}]),
                 ["node02: vllm_fleet_instances", "80; rm", "unique ports (1-65535)"]),
    "no-promtool": ({"vllm_fleet_monitoring_promtool": "/nonexistent/promtool"}, None,
                    ["vllm_fleet_monitoring_promtool: /nonexistent/promtool is not an executable"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_settings_are_refused_naming_the_variable_and_nothing_is_written(tmp_path, case):
    extra, host_instances, needles = BAD[case]
    inventory = json.loads(json.dumps(INVENTORY))
    if host_instances:
        inventory["all"]["hosts"][host_instances[0]]["vllm_fleet_instances"] = host_instances[1]
    out = tmp_path / "prometheus"
    proc = apply(tmp_path, out, inventory=inventory, **extra)
    assert proc.returncode != 0
    for needle in needles:
        assert needle in proc.stdout, (needle, proc.stdout[-3000:])
    assert not out.exists()
