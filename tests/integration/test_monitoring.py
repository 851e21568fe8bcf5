"""Observability end to end: a one-node simulated fleet serving the fixed release
(playbooks/site.yml), the fleet_monitoring role applied on this host (playbooks/monitoring.yml),
and a real Prometheus (Debian's package) scraping the node's vLLM /metrics through the role's
file_sd targets and evaluating the role's rules every second, with the rules' durations
shortened through the role's variables.

Under client traffic the engine makes progress: no wedge alert (negative control). Then the
engine is wedged the way test_faults does it (SIGUSR1 to the stand-in vLLM: /health stays 200,
requests stay running, no token is generated) and VLLMEngineWedged must fire for that node.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.story import EXIT0, FIXED, FLEET_VARS, FP8, SERVED
from tests.fixtures.simnode import simnode
from tests.integration.playbook import ansible_playbook
from tests.integration.test_coredump import wait_until

NODE = "node01"
FLEET = "vllm-fleet"
# Scaled down for a test: a scrape and an evaluation every second, a wedge is no progress
# over 6 s held for 3 s (the role's defaults: 2m and 1m).
MONITORING = {
    "vllm_fleet_monitoring_wedge_window": "6s",
    "vllm_fleet_monitoring_wedge_for": "3s",
    "vllm_fleet_monitoring_wedge_unhandled_for": "10m",
    "vllm_fleet_monitoring_down_for": "5s",
    "vllm_fleet_monitoring_reload_service": "",  # this Prometheus is started below, after the files
}
WEDGE = "systemctl kill -s SIGUSR1 vllm@gpu0"  # the stand-in's wedge; a second one resumes it


@pytest.fixture(scope="module")
def node(node_image, tmp_path_factory):
    """One simulated sm_120 node serving the fixed release, its watchdog observe-only (so it
    does not restart the wedged engine while the alert is awaited); removed afterwards."""
    from tests.fixtures.nvml.build import PROFILES_DIR, build_fake_nvml
    from tests.fixtures.wheels.build import build_node_wheelhouse

    directory = tmp_path_factory.mktemp("monitoring")
    wheelhouse = build_node_wheelhouse(directory / "wheelhouse")
    prefix = f"vf-mon-{os.getpid()}-"
    port = simnode.free_port()
    try:
        sim = simnode.start_node(NODE, nvml_lib=build_fake_nvml(directory / "nvml"),
                                 nvml_profile=PROFILES_DIR / "rtx_pro_6000.conf", image=node_image, prefix=prefix,
                                 volumes=(f"{wheelhouse}:/srv/wheelhouse:ro",))
        inventory = simnode.write_inventory(
            [sim], directory / "inventory.yml", {"canary": [NODE]},
            host_vars={NODE: {"vllm_fleet_instances": [{"name": "gpu0", "gpu": 0, "port": port}]}},
            all_vars={**FLEET_VARS, "vllm_fleet_watchdog_max_restarts": 0})
        run = ansible_playbook("playbooks/site.yml", inventory, timeout=900, extra_vars={
            "vllm_fleet_release": FIXED, "vllm_fleet_profile": FP8, "vllm_fleet_accepted_risks": [EXIT0],
            "vllm_fleet_report_dir": str(directory / "reports")})
        assert run.rc == 0, run.output[-4000:]
        yield {"sim": sim, "inventory": inventory, "port": port, "directory": directory}
    finally:
        simnode.remove_nodes(prefix)


class Prometheus:
    """Debian's prometheus on a free loopback port, with its own config and storage."""

    def __init__(self, directory: Path, rules: Path, targets: Path):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: run scripts/setup-host.sh as root", pytrace=False)
        directory.mkdir(parents=True, exist_ok=True)
        self.port = simnode.free_port()
        config = directory / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [{"files": [str(targets)],
                                                                          "refresh_interval": "5s"}]}],
        }))
        self.log = directory / "prometheus.log"
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"))
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"prometheus did not become ready:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def alerts(self, name: str) -> list[dict]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def prometheus(node):
    out = node["directory"] / "prometheus-files"
    run = ansible_playbook("playbooks/monitoring.yml", node["inventory"], timeout=300, extra_vars={
        **MONITORING, "vllm_fleet_monitoring_dir": str(out), "vllm_fleet_monitoring_promtool": shutil.which("promtool")})
    assert run.rc == 0, run.output[-4000:]
    server = Prometheus(node["directory"] / "prometheus", out / f"{FLEET}.rules.yml", out / f"{FLEET}.targets.json")
    try:
        yield server
    finally:
        server.stop()


class Clients:
    """Completions straight to the node, one after another on each worker, each long enough
    to stay running for a few seconds (so there are requests in flight to wedge)."""

    def __init__(self, port: int, workers: int = 2):
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]

    def _work(self):
        body = json.dumps({"model": SERVED, "prompt": "keep the engine busy", "max_tokens": 150,
                           "ignore_eos": True}).encode()
        while not self.stopping.is_set():
            request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)


def test_prometheus_fires_the_wedge_alert_for_a_wedged_node_and_not_before(node, prometheus, record_property):
    selector = f'{{fleet="{FLEET}",node="{NODE}",vllm_instance="gpu0"}}'
    # Prometheus found the node through the role's targets file and scrapes vLLM's metrics.
    wait_until(lambda: [r for r in prometheus.query(f"up{selector}") if r["value"][1] == "1"], 30,
               f"Prometheus scraping {NODE} (targets: {prometheus.api('targets')['activeTargets']})")
    [target] = prometheus.api("targets")["activeTargets"]
    assert target["labels"]["unit"] == "vllm@gpu0.service" and target["scrapeUrl"].endswith(f":{node['port']}/metrics")

    with Clients(node["port"]):
        # Negative control: requests in flight, the engine generating. Longer than the wedge
        # window plus its `for`: a rule that ignored progress would be pending or firing by now.
        wait_until(lambda: [r for r in prometheus.query(f"vllm:num_requests_running{selector} > 0")], 30,
                   "requests running on the node")
        watched_until = time.monotonic() + 12
        while time.monotonic() < watched_until:
            assert prometheus.alerts("VLLMEngineWedged") == [], "a wedge alert while the engine makes progress"
            time.sleep(1)
        assert [r for r in prometheus.query(f"rate(vllm:generation_tokens_total{selector}[6s]) > 0")]

        node["sim"].exec(WEDGE, check=True)
        wedged_at = time.monotonic()
        try:
            firing = wait_until(lambda: [a for a in prometheus.alerts("VLLMEngineWedged") if a["state"] == "firing"],
                                60, "VLLMEngineWedged firing after the wedge")
            seen_after = time.monotonic() - wedged_at
        finally:
            node["sim"].exec(WEDGE, check=True)  # resume, so the clients' requests finish
    record_property("wedge_to_alert_s", round(seen_after, 1))
    print(f"\nwedge -> VLLMEngineWedged firing: {seen_after:.1f} s (window 6s, for 3s, scrape/eval 1s)")
    [alert] = firing
    assert {k: alert["labels"][k] for k in ("node", "vllm_instance", "unit", "fleet", "severity")} == {
        "node": NODE, "vllm_instance": "gpu0", "unit": "vllm@gpu0.service", "fleet": FLEET, "severity": "critical"}
    assert alert["annotations"]["summary"] == f"{NODE}/gpu0: requests in flight, no progress"
    # Not before the window and its `for` could have passed, nor long after.
    assert 6 <= seen_after <= 30, seen_after
    # The node stayed up for Prometheus the whole time: a wedge is not a down instance.
    assert prometheus.alerts("VLLMInstanceDown") == []
