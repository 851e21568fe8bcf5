"""rollout.yml on a simulated fleet, replaying the story end to end: four sm_120 nodes
behind a real HAProxy, each serving the pre-fix release under the FP8 profile, client
traffic through HAProxy the whole time, and the rollout of the NVFP4 profile:

1. with cuDNN 9.19 (torch's own pin) preflight blocks;
2. with that risk accepted, the canary's soak catches the crash, the canary is rolled back
   to its previous release and profile and serves again, the rollout halts, no other node
   changed;
3. with cuDNN 9.24.0.43 the canary passes and the fleet advances batch by batch;
4. a re-run on the converged fleet changes nothing;
5. playbooks/rollback.yml (through the CLI) takes a node left on an unproven release back
   to its known-good one and leaves the others alone.

Tests run in file order on one fleet (setting it up costs an install and a start per node).
"""
from __future__ import annotations

import os

import pytest

from tests.fixtures.simnode.fleet import SimFleet, Traffic
from tests.fixtures.story import (ACCEPT_PRE_FIX, CUDNN_BLOCKER, EXIT0, FIXED, FIXED_ID, FP8, NVFP4,
                                  PRE_FIX, PRE_FIX_ID, SERVED, clear_reports, node_exec, play, provisioned_fleet,
                                  report, state)
from tests.integration.playbook import vllm_fleet
from tests.unit.test_report import needs_chromium, render, visible
from vllm_fleet import report as rep

NODES = ["node01", "node02", "node03", "node04"]


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("rollout"), f"vf-roll-{os.getpid()}-",
                           len(NODES)) as sim:
        yield sim


def fleet_state(sim: SimFleet) -> dict:
    return {node: state(sim, node) for node in NODES}


def rendered_report(sim: SimFleet, tmp_path):
    """The HTML page of the fleet's last run as the CLI's `report` builds it, from what the
    plain playbook run left in the report dir (the soak gate fetches each soak's files),
    rendered by Chromium: (screenshot, boxes laid out)."""
    page = rep.build_report(sim.directory / "reports", tmp_path / "rollout.html", None)
    shot, boxes, _ = render(page)
    return shot, boxes


def plots_of(boxes: dict) -> dict:
    return {key: box for key, box in boxes.items() if key.startswith("plot:")}


def assert_badge(shot, boxes: dict, cls: str, color: str) -> None:
    box = next(v for k, v in boxes.items() if cls in k)
    assert shot.count(color, box, tol=3) > 0.5 * box[2] * box[3], (cls, box)


def test_provisioned_fleet_serves_the_pre_fix_release(fleet):
    for node, st in fleet_state(fleet).items():
        assert (st["current"], st["known_good"], st["profile"], st["ActiveState"]) == \
               (PRE_FIX_ID, PRE_FIX_ID, FP8["name"], "active"), node


def test_preflight_blocks_cudnn_9_19_on_sm120_before_anything_changes(fleet):
    before = fleet_state(fleet)
    run = play(fleet, "rollout.yml", release=PRE_FIX, profile_=NVFP4, accept=[EXIT0])

    assert run.rc != 0
    assert f"[{CUDNN_BLOCKER}]" in run.output
    assert fleet_state(fleet) == before


def test_accepted_risk_canary_soak_catches_the_crash_and_rolls_back(fleet):
    clear_reports(fleet)
    before = fleet_state(fleet)
    with Traffic(fleet, SERVED) as traffic:
        run = play(fleet, "rollout.yml", release=PRE_FIX, profile_=NVFP4,
                   accept=[*ACCEPT_PRE_FIX])

    assert run.rc != 0
    assert "rollout halted at node01" in run.output
    canary = report(fleet, "node01")
    assert canary["status"] == "rolled_back"
    assert canary["soak"]["passed"] is False
    assert any("illegal memory access" in reason or "misaligned address" in reason or "crash" in reason
               for reason in canary["soak"]["reasons"]), canary["soak"]["reasons"]
    after = fleet_state(fleet)
    # The canary serves its previous release and profile again ...
    assert (after["node01"]["current"], after["node01"]["profile"], after["node01"]["ActiveState"]) == \
           (PRE_FIX_ID, FP8["name"], "active")
    # ... and nothing else was touched.
    for node in NODES[1:]:
        assert after[node] == before[node], node
        assert report(fleet, node) is None
    # The canary alone left traffic (drained, then down while it crashed and came back),
    # and no client request failed or was quietly retried elsewhere by HAProxy.
    assert traffic.out_seen == {"node01"} and traffic.most_out == 1
    traffic.assert_clean()


@needs_chromium
def test_the_halted_runs_report_plots_the_canarys_crash(fleet, tmp_path):
    fetched = sorted((fleet.directory / "reports" / "rollout").glob("*/soak/*/*"))
    assert [(p.parts[-4], p.name) for p in fetched] == [("node01", "progress.jsonl"), ("node01", "verdict.json")]
    shot, boxes = rendered_report(fleet, tmp_path)
    assert_badge(shot, boxes, "outcome-halted", rep.OUTCOME_COLORS["halted"])
    assert_badge(shot, boxes, "status-rolled_back", rep.STATUS_COLORS["rolled_back"])
    plots = plots_of(boxes)
    assert len(plots) == 3, sorted(plots)
    for key, box in plots.items():
        assert visible(box, shot) and shot.count(rep.PLOT_COLORS[key.rsplit("-", 1)[1]], box) > 60, key
        # The crash: a full-height marker line in every plot of the canary's soak.
        assert shot.tallest_column(rep.MARKER_COLORS["crash"], box) > 0.55 * box[3], key


def test_fixed_cudnn_passes_the_canary_and_the_fleet_advances_batch_by_batch(fleet):
    clear_reports(fleet)
    with Traffic(fleet, SERVED) as traffic:
        run = play(fleet, "rollout.yml", release=FIXED, profile_=NVFP4, accept=[EXIT0])

    assert run.rc == 0, run.output[-5000:]
    reports = {node: report(fleet, node) for node in NODES}
    for node, st in fleet_state(fleet).items():
        assert (st["current"], st["known_good"], st["profile"], st["ActiveState"]) == \
               (FIXED_ID, FIXED_ID, NVFP4["name"], "active"), node
        assert reports[node]["status"] == "upgraded" and reports[node]["soak"]["passed"] is True
    # canary alone, then node02, then node03 and node04 together
    order = sorted(NODES, key=lambda n: reports[n]["started"])
    assert order[0] == "node01"
    assert reports["node01"]["finished"] <= reports["node02"]["started"]
    assert reports["node02"]["finished"] <= min(reports["node03"]["started"], reports["node04"]["started"])
    # At most one batch (two of four nodes) out of traffic at once, by admin or operational
    # state; no client request failed, HAProxy retried or redispatched none.
    assert traffic.out_seen == set(NODES) and traffic.most_out == 2
    print("full rollout through HAProxy:", traffic.summary())
    traffic.assert_clean()


@needs_chromium
def test_the_converged_runs_report_plots_every_soak(fleet, tmp_path):
    shot, boxes = rendered_report(fleet, tmp_path)
    assert_badge(shot, boxes, "outcome-converged", rep.OUTCOME_COLORS["converged"])
    plots = plots_of(boxes)
    assert len(plots) == 3 * len(NODES), sorted(plots)
    shown = [key for key, box in plots.items() if visible(box, shot)]
    assert len(shown) >= 6, "fewer than two soaks fit the window"
    for key in shown:
        assert shot.count(rep.PLOT_COLORS[key.rsplit("-", 1)[1]], plots[key]) > 60, key
        assert shot.tallest_column(rep.MARKER_COLORS["crash"], plots[key]) == 0, key


def test_rerun_on_the_converged_fleet_changes_nothing(fleet):
    clear_reports(fleet)
    before = fleet_state(fleet)
    run = play(fleet, "rollout.yml", release=FIXED, profile_=NVFP4, accept=[EXIT0])

    assert run.rc == 0, run.output[-4000:]
    assert fleet_state(fleet) == before
    assert {report(fleet, n)["status"] for n in NODES} == {"skipped"}
    assert "soak progress" not in run.output


def test_rollback_returns_a_node_on_an_unproven_release_to_its_known_good_one(fleet, tmp_path):
    before = fleet_state(fleet)
    # node02 is put on the old release by hand (still installed), as a cutover without a gate would.
    node_exec(fleet, "node02", f"ln -sfn releases/{PRE_FIX_ID} /opt/vllm-fleet/current && systemctl restart vllm@gpu0")
    assert state(fleet, "node02")["current"] == PRE_FIX_ID

    # No client traffic here: node02 on the pre-fix release with the NVFP4 profile crashes under load by design.
    code, output, summary, junit = vllm_fleet(tmp_path, "rollback", "-i", str(fleet.inventory), timeout=900)

    assert code == 0, output[-4000:]
    statuses = {host: info["status"] for host, info in summary["hosts"].items()}
    assert statuses == {"node01": "skipped", "node02": "reverted", "node03": "skipped", "node04": "skipped"}
    after = fleet_state(fleet)
    assert (after["node02"]["current"], after["node02"]["ActiveState"]) == (before["node02"]["current"], "active")
    for node in ("node01", "node03", "node04"):
        assert after[node] == before[node], node
