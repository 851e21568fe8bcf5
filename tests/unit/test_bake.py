"""The bake's verdict (plugins/module_utils/bake.py): a node back in traffic after its soak,
judged from HAProxy's per-server counters and states, its vLLM units and their metrics.
Inputs have the shapes the tasks hand over: haproxy_servers' ``servers`` (real `show stat`
counter names), systemd's properties as ansible.builtin.systemd_service returns them, and
vllm_metrics' result."""
from __future__ import annotations

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.bake import bake_verdict, parse_units

LIMITS = {"max_5xx": 0, "max_errors": 0, "max_kv_usage": 0.95}


def server(**counters) -> dict:
    base = {"admin": "READY", "operational": "UP", "status": "UP", "scur": 0, "wretr": 0, "wredis": 0,
            "econ": 0, "eresp": 0, "hrsp_5xx": 0, "stot": 100}
    return {**base, **counters}


def unit(invocation="a1", restarts="0", state="active", instance="gpu0") -> str:
    """What `systemctl show -p Id -p InvocationID -p NRestarts -p ActiveState` prints for a unit."""
    return f"Id=vllm@{instance}.service\nInvocationID={invocation}\nNRestarts={restarts}\nActiveState={state}\n"


def metrics(kv=0.3, reachable=True) -> dict:
    if not reachable:
        return {"reachable": False, "error": "[Errno 111] Connection refused"}
    return {"reachable": True, "metrics": {"kv_cache_usage_perc": kv}}


def judge(lb_after=None, units_after=None, metrics_=None, limits=LIMITS, lb_before=None):
    lb_before = lb_before or {"node01": server(), "node02": server(stot=500)}
    lb_after = lb_after or {"node01": server(stot=180), "node02": server(stot=900, hrsp_5xx=7)}
    return bake_verdict(lb_before, lb_after, ["node01"], unit(), units_after or unit(),
                        metrics_ or {"gpu0": metrics()}, limits, 30.0)


def test_a_clean_bake_passes_and_counts_what_it_saw():
    verdict = judge()
    assert verdict == {"passed": True, "reasons": [], "seconds": 30.0, "proved": True,
                       "requests": 80, "hrsp_5xx": 0, "errors": 0, "restarts": 0}


def test_only_the_nodes_own_servers_are_judged():
    # node02's 5xx (another node, in the fixture above) do not fail node01's bake.
    assert judge()["passed"] is True


@pytest.mark.parametrize("counters, words", [
    ({"hrsp_5xx": 3}, "3 HTTP 5xx answers to clients in the bake's 30 s (at most 0: vllm_fleet_bake_max_5xx)"),
    ({"eresp": 1}, "1 connection/response errors, retries or redispatches"),
    ({"econ": 2}, "2 connection/response errors"),
    ({"wretr": 1}, "vllm_fleet_bake_max_errors"),
    ({"wredis": 1}, "vllm_fleet_bake_max_errors"),
    ({"operational": "DOWN"}, "HAProxy shows node01 READY DOWN, not READY and UP"),
    ({"admin": "DRAIN"}, "HAProxy shows node01 DRAIN UP"),
])
def test_haproxy_signals_fail_the_bake(counters, words):
    verdict = judge(lb_after={"node01": server(stot=180, **counters)})
    assert verdict["passed"] is False and verdict["proved"] is False
    assert any(words in reason for reason in verdict["reasons"]), verdict["reasons"]


def test_limits_allow_what_they_say():
    after = {"node01": server(stot=180, hrsp_5xx=2, eresp=1)}
    assert judge(lb_after=after, limits={**LIMITS, "max_5xx": 2, "max_errors": 1})["passed"] is True
    assert judge(lb_after=after, limits={**LIMITS, "max_5xx": 1, "max_errors": 1})["passed"] is False


@pytest.mark.parametrize("after, words", [
    (unit(invocation="b2"), "vllm@gpu0 restarted or stopped"),  # the watchdog's systemctl restart
    (unit(restarts="1"), "vllm@gpu0 restarted"),  # Restart=always
    (unit(state="activating"), "(activating)"),
])
def test_a_restarted_unit_fails_the_bake(after, words):
    verdict = judge(units_after=after)
    assert verdict["passed"] is False and verdict["restarts"] == 1
    assert any(words in reason for reason in verdict["reasons"]), verdict["reasons"]


def test_metrics_unreachable_or_a_full_kv_cache_fail_the_bake():
    down = judge(metrics_={"gpu0": metrics(reachable=False)})
    assert down["reasons"] == ["vllm@gpu0 does not answer its metrics: [Errno 111] Connection refused"]
    full = judge(metrics_={"gpu0": metrics(kv=0.97)})
    assert full["reasons"] == ["vllm@gpu0 KV cache 97% full (at most 95%: vllm_fleet_bake_max_kv_usage)"]


def test_a_server_gone_from_haproxy_fails_and_a_reset_counter_counts_from_zero():
    assert judge(lb_after={"node02": server()})["reasons"] == ["HAProxy has no server node01 any more"]
    # HAProxy reloaded without its state: counters restart at zero; what they show now is new.
    reset = judge(lb_before={"node01": server(stot=1000, hrsp_5xx=50)}, lb_after={"node01": server(stot=40, hrsp_5xx=2)})
    assert (reset["requests"], reset["hrsp_5xx"], reset["passed"]) == (40, 2, False)


def test_no_client_request_passes_but_proves_nothing():
    verdict = judge(lb_after={"node01": server(stot=100)})
    assert (verdict["passed"], verdict["proved"], verdict["requests"]) == (True, False, 0)


def test_units_are_read_from_systemctl_show_several_at_once():
    text = unit(instance="gpu0") + "\n" + unit(instance="gpu1", invocation="c3") + "\n"
    assert parse_units(text) == {
        "gpu0": {"Id": "vllm@gpu0.service", "InvocationID": "a1", "NRestarts": "0", "ActiveState": "active"},
        "gpu1": {"Id": "vllm@gpu1.service", "InvocationID": "c3", "NRestarts": "0", "ActiveState": "active"}}
    # gpu1 restarted, gpu0 did not
    assert bake_verdict({}, {}, [], text, unit(instance="gpu0") + "\n" + unit(instance="gpu1", invocation="d4"),
                        {}, LIMITS)["reasons"] == ["vllm@gpu1 restarted or stopped in the bake's 0 s (active)"]


def test_missing_limits_are_an_error():
    with pytest.raises(ValueError, match="max_kv_usage"):
        judge(limits={"max_5xx": 0, "max_errors": 0})
