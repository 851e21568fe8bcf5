# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""The bake's judgement: a node back in client traffic after its soak, watched for a while
from live signals, fails if HAProxy saw it answer 5xx or fail connections and responses,
retry or redispatch its requests, or stop reporting it UP; if a vLLM unit of it restarted
(systemd's or the watchdog's restart: a new invocation); or if an instance stopped answering
its metrics or filled its KV cache. Plain data in, a verdict out: unit-tested without
Ansible, used by the filter ``vllm_fleet.fleet.bake_verdict``."""

from __future__ import annotations

# HAProxy's per-server counters (show stat) that mean a client request went wrong there.
ERROR_COUNTERS = ("econ", "eresp", "wretr", "wredis")
LIMITS = ("max_5xx", "max_errors", "max_kv_usage")


def _delta(before: dict, after: dict, key: str) -> int:
    # A counter that went down was reset (HAProxy reloaded without its state): count from zero.
    now, then = int(after.get(key) or 0), int(before.get(key) or 0)
    return now - then if now >= then else now


def parse_units(text: str) -> dict:
    """``systemctl show -p Id -p InvocationID -p NRestarts -p ActiveState UNIT...`` (one block
    of key=value lines per unit, blocks apart by a blank line) as {instance: properties} for
    units named vllm@<instance>.service."""
    units = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        unit_id = props.get("Id", "")
        if unit_id.startswith("vllm@") and unit_id.endswith(".service"):
            units[unit_id[len("vllm@"):-len(".service")]] = props
    return units


def _restarted(before: dict, after: dict) -> bool:
    """A new invocation (any start: Restart=, the watchdog's restart, a person's) or more
    automatic restarts; an inactive unit counts as restarted too."""
    if after.get("ActiveState") != "active":
        return True
    if before.get("InvocationID") and after.get("InvocationID") != before.get("InvocationID"):
        return True
    return int(after.get("NRestarts") or 0) > int(before.get("NRestarts") or 0)


def bake_verdict(lb_before: dict, lb_after: dict, servers: list, units_before: str, units_after: str,
                 metrics: dict, limits: dict, seconds: float = 0.0) -> dict:
    """The bake's verdict for one node.

    lb_before/lb_after: HAProxy's servers of the backend by name (haproxy_servers' ``servers``:
    admin, operational, hrsp_5xx, econ, eresp, wretr, wredis, stot); servers: the node's
    server names among them (one missing after the bake fails it); units_before/after:
    ``systemctl show`` of the node's vLLM units (parse_units); metrics: vllm_metrics' result by instance (reachable, metrics.kv_cache_usage_perc);
    limits: max_5xx, max_errors (a count over the bake), max_kv_usage (0-1).
    """
    missing = [key for key in LIMITS if key not in limits]
    if missing:
        raise ValueError("bake limits missing: %s" % ", ".join(missing))
    took = "in the bake's %.0f s" % seconds
    units_before, units_after = parse_units(units_before), parse_units(units_after)
    reasons = []
    totals = {"requests": 0, "hrsp_5xx": 0, "errors": 0, "restarts": 0}
    for name in sorted(servers):
        if name not in lb_after:
            reasons.append("HAProxy has no server %s any more" % name)
            continue
        after, before = lb_after[name], lb_before.get(name, {})
        if after.get("admin") != "READY" or after.get("operational") != "UP":
            reasons.append("HAProxy shows %s %s %s, not READY and UP" % (name, after.get("admin"), after.get("operational")))
        totals["requests"] += _delta(before, after, "stot")
        totals["hrsp_5xx"] += _delta(before, after, "hrsp_5xx")
        totals["errors"] += sum(_delta(before, after, key) for key in ERROR_COUNTERS)
    if totals["hrsp_5xx"] > limits["max_5xx"]:
        reasons.append("%d HTTP 5xx answers to clients %s (at most %d: vllm_fleet_bake_max_5xx)"
                       % (totals["hrsp_5xx"], took, limits["max_5xx"]))
    if totals["errors"] > limits["max_errors"]:
        reasons.append("%d connection/response errors, retries or redispatches in HAProxy %s "
                       "(at most %d: vllm_fleet_bake_max_errors)" % (totals["errors"], took, limits["max_errors"]))
    for instance in sorted(units_after):
        if _restarted(units_before.get(instance, {}), units_after[instance]):
            totals["restarts"] += 1
            reasons.append("vllm@%s restarted or stopped %s (%s)" % (
                instance, took, units_after[instance].get("ActiveState", "?")))
    for instance in sorted(metrics):
        result = metrics[instance]
        if not result.get("reachable"):
            reasons.append("vllm@%s does not answer its metrics: %s" % (instance, result.get("error", "?")))
            continue
        usage = (result.get("metrics") or {}).get("kv_cache_usage_perc")
        if usage is not None and usage > limits["max_kv_usage"]:
            reasons.append("vllm@%s KV cache %.0f%% full (at most %.0f%%: vllm_fleet_bake_max_kv_usage)"
                           % (instance, usage * 100, limits["max_kv_usage"] * 100))
    return {
        "passed": not reasons,
        "reasons": reasons,
        "seconds": round(seconds, 1),
        # No client request reached the node: the bake saw nothing, and says so.
        "proved": totals["requests"] > 0 and not reasons,
        **totals,
    }
