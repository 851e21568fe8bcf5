"""Configuration drift is rolled like a release, and the API key is rotated with no client
noticing (docs/SECURITY.md, "Rotating the API key"; issue 14 item 2).

On a fleet of two nodes of its own, serving the fixed release with the NVFP4 profile and
the key OLD, clients on OLD through HAProxy the whole time:
- a re-run with nothing changed skips both nodes (the fingerprint matches);
- a canary turn that fails inside the window is rolled back to the old key and unit, its
  readiness probed with the key it takes;
- opening the window (NEW, OLD still accepted) with a unit change in the same run gives each
  node a turn although its release and profile are the same: drained, restarted on the new
  unit (systemd reloaded before the start), soaked, returned; both keys answer; 0 failed,
  retried or redispatched requests; the re-run skips both;
- closing the window (clients on NEW) leaves NEW the only key: OLD gets 401 from every node;
- no key, old or new, is in any node's journal, during the window or after it: vLLM 0.25.1 logs
  every non-default argument at start, the window's keys included (they are in the instance
  config then), and the role's logging configuration drops that line (tests/unit/
  test_serve_config.py holds the negative control: the stand-in logs the keys without it).
Negative controls: a client still on OLD after the window fails (the clients' key is
checked, so "0 failed" above means something), and a unit changed on disk without a reload
is seen by the same NeedDaemonReload check that passed after each turn."""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest

from tests.fixtures.simnode.fleet import SimFleet, Traffic
from tests.fixtures.story import EXIT0, FIXED, FIXED_ID, NVFP4, SERVED, clear_reports, node_exec, play, provisioned_fleet, report
from tests.integration.faults import FAST, NODES

OLD = "old-key-0123456789abcdefghij"
NEW = "new-key-9876543210zyxwvutsrq"


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("rotation"), f"vf-rot-{os.getpid()}-", len(NODES),
                           release=FIXED, profile_=NVFP4, accept=[EXIT0],
                           group_vars={**FAST, "vllm_fleet_service_api_key": OLD}) as sim:
        yield sim


def rollout(sim: SimFleet, client_key: str, *args: str, **keys):
    """rollout.yml on the same release and profile, clients on client_key throughout."""
    clear_reports(sim)
    with Traffic(sim, SERVED, workers=2, api_key=client_key) as traffic:
        run = play(sim, "rollout.yml", *args, release=FIXED, profile_=NVFP4, accept=[EXIT0], **keys)
    return run, traffic


def status_with(sim: SimFleet, node: str, key: str) -> int:
    """HTTP status of /v1/models straight from the node with key."""
    request = urllib.request.Request(f"http://127.0.0.1:{sim.port(NODES.index(node) + 1)}/v1/models",
                                     headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def unit(sim: SimFleet, node: str, prop: str) -> str:
    return node_exec(sim, node, f"systemctl show vllm@gpu0 --property={prop} --value")


def statuses(sim: SimFleet) -> list[str]:
    return [report(sim, node)["status"] for node in NODES]


def no_key_anywhere(sim: SimFleet, run) -> None:
    reports = "".join(path.read_text(errors="replace") for path in (sim.directory / "reports").rglob("*")
                      if path.is_file())
    for key in (OLD, NEW):
        assert key not in run.output and key not in reports
    for node in NODES:
        # Every field of every entry of the node's journal (the instances' start-up lines included).
        journal = node_exec(sim, node, "journalctl --no-pager -o verbose --all")
        assert "_SYSTEMD_UNIT=vllm@gpu0.service" in journal and "SYSLOG_IDENTIFIER=vllm@gpu0" in journal, node
        assert [key for key in (OLD, NEW) if key in journal] == [], f"{node}: an API key is in the journal"


def test_a_new_key_and_unit_are_rolled_node_by_node_and_the_old_key_retired(fleet):
    run, traffic = rollout(fleet, OLD)
    assert run.rc == 0, run.output[-4000:]
    assert statuses(fleet) == ["skipped", "skipped"]  # converged: nothing drifted
    traffic.assert_clean()

    window = {"vllm_fleet_service_api_key": NEW, "vllm_fleet_service_api_key_retiring": [OLD],
              "vllm_fleet_service_restart_sec": 3}

    # The canary's turn fails inside the window (a baseline no node meets): it is rolled back
    # to the configuration it passed with, old key and old unit included, and its readiness
    # probes find the key it takes (OLD). Clients on OLD never notice.
    run, traffic = rollout(fleet, OLD, "--limit", "canary", **window,
                           vllm_fleet_soak_baseline={"total_token_throughput": 10 ** 9})
    assert run.rc != 0 and report(fleet, "node01")["status"] == "rolled_back", run.output[-4000:]
    assert (status_with(fleet, "node01", OLD), status_with(fleet, "node01", NEW)) == (200, 401)
    assert (unit(fleet, "node01", "RestartUSec"), unit(fleet, "node01", "NeedDaemonReload")) == ("1s", "no")
    traffic.assert_clean()

    # Open the window, and change the unit in the same run.
    run, traffic = rollout(fleet, OLD, **window)
    assert run.rc == 0, run.output[-4000:]
    assert statuses(fleet) == ["upgraded", "upgraded"]
    said = " ".join(run.output.split())  # the result format wraps long lines
    for node in NODES:
        assert (f"{node} serves {FIXED_ID}, but its configuration differs from the one that release passed with "
                "(/etc/systemd/system/vllm@.service, /etc/vllm-fleet/api-key.env, /etc/vllm-fleet/gpu0.yaml)") in said
    for node in NODES:
        marks = report(fleet, node)["marks"]
        assert {"drained", "configured", "ready", "soaked", "returned"} <= set(marks), marks
        assert (status_with(fleet, node, NEW), status_with(fleet, node, OLD)) == (200, 200), node
        # The process runs the new unit: systemd reloaded before the start.
        assert (unit(fleet, node, "RestartUSec"), unit(fleet, node, "NeedDaemonReload")) == ("3s", "no"), node
    assert traffic.most_out == 1
    traffic.assert_clean()
    print("window opened:", traffic.summary())
    for node in NODES:  # the keys are vLLM arguments now: its start-up line would have logged them
        config = node_exec(fleet, node, "cat /etc/vllm-fleet/gpu0.yaml")
        assert f'api-key: ["{NEW}", "{OLD}"]' in config.splitlines(), node
        assert "api_utils" in node_exec(fleet, node, "cat /etc/vllm-fleet/logging.json"), node
    no_key_anywhere(fleet, run)

    run, traffic = rollout(fleet, OLD, **window)
    assert run.rc == 0, run.output[-4000:]
    assert statuses(fleet) == ["skipped", "skipped"]
    traffic.assert_clean()

    # The clients moved to NEW: close the window.
    closed = {"vllm_fleet_service_api_key": NEW, "vllm_fleet_service_restart_sec": 3}
    run, traffic = rollout(fleet, NEW, **closed)
    assert run.rc == 0, run.output[-4000:]
    assert statuses(fleet) == ["upgraded", "upgraded"]
    for node in NODES:
        assert (status_with(fleet, node, NEW), status_with(fleet, node, OLD)) == (200, 401), node
        # The window's keys left the instance config with the window.
        assert OLD not in node_exec(fleet, node, "cat /etc/vllm-fleet/gpu0.yaml /etc/vllm-fleet/known-good/*")
    assert traffic.most_out == 1
    traffic.assert_clean()
    print("window closed:", traffic.summary())
    no_key_anywhere(fleet, run)


def test_negative_controls_a_retired_key_fails_and_an_unreloaded_unit_is_seen(fleet):
    with Traffic(fleet, SERVED, workers=1, api_key=OLD) as traffic:
        time.sleep(2)
    assert traffic.summary()["failed"] > 0 and "401" in " ".join(traffic.failures)

    node_exec(fleet, "node01", "touch /etc/systemd/system/vllm@.service")
    try:
        assert unit(fleet, "node01", "NeedDaemonReload") == "yes"
    finally:
        node_exec(fleet, "node01", "systemctl daemon-reload")


def test_a_recorded_fingerprint_is_root_only_and_holds_no_key(fleet):
    mode = node_exec(fleet, "node01", "stat -c '%a %U' /etc/vllm-fleet/known-good/fingerprint.json")
    assert mode == "600 root"
    record = json.loads(node_exec(fleet, "node01", "cat /etc/vllm-fleet/known-good/fingerprint.json"))
    assert record["files"]["/etc/vllm-fleet/api-key.env"].startswith("hmac-sha256:")
    assert NEW not in json.dumps(record) and OLD not in json.dumps(record)
