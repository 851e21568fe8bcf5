#!/usr/bin/python
"""vllm_metrics: read a vLLM instance's Prometheus metrics."""

DOCUMENTATION = r"""
module: vllm_metrics
short_description: Read the load and progress of a vLLM instance from its /metrics
description:
  - Fetches a vLLM server's C(/metrics) and returns the V1 series a rollout decides on, each
    aggregated over its C(model_name)/C(engine) label sets by the rule the soak and the watchdog
    use too (summed; C(kv_cache_usage_perc) is the fullest engine's).
  - An instance that does not answer is reported with C(reachable=false), not a failure, so
    C(until) loops can wait on it.
version_added: 0.1.0
options:
  url:
    description: The metrics URL, for example C(http://127.0.0.1:8000/metrics).
    type: str
    required: true
  timeout:
    description: Seconds to wait for the answer.
    type: int
    default: 10
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait until the drained instance has nothing in flight
  vllm_fleet.fleet.vllm_metrics:
    url: http://127.0.0.1:8000/metrics
  register: metrics
  until: not metrics.reachable or metrics.in_flight == 0
  retries: 300
  delay: 2
"""

RETURN = r"""
reachable:
  description: Whether the instance answered C(/metrics) with 200.
  type: bool
  returned: always
error:
  description: Why it did not, when it did not.
  type: str
  returned: when RV(reachable) is false
in_flight:
  description: Requests running plus waiting (null when unreachable or when either gauge is missing).
  type: float
  returned: always
missing:
  description: The series judging progress needs that the answer lacked ("metrics incomplete").
  type: list
  elements: str
  returned: always
  sample: [vllm:num_requests_waiting]
metrics:
  description: The series that matter, aggregated over label sets (sum; KV usage the maximum); null where absent.
  type: dict
  returned: always
  sample:
    num_requests_running: 3.0
    num_requests_waiting: 0.0
    generation_tokens_total: 123456.0
    prompt_tokens_total: 9876543.0
    kv_cache_usage_perc: 0.42
    num_preemptions_total: 0.0
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import (
    SERIES,
    EngineMetrics,
)

# The attributes reported, by their series name without the "vllm:" prefix.
REPORTED = ("running", "waiting", "generation_tokens", "prompt_tokens", "kv_usage", "preemptions")


def main():
    module = AnsibleModule(
        argument_spec=dict(url=dict(type="str", required=True), timeout=dict(type="int", default=10)),
        supports_check_mode=True,
    )
    try:
        text = open_url(module.params["url"], timeout=module.params["timeout"]).read().decode("utf-8", "replace")
    except Exception as exc:  # refused, timeout, HTTP error: all mean "not serving now"
        module.exit_json(changed=False, reachable=False, error=str(exc), in_flight=None, missing=[],
                         metrics={SERIES[attr][0][len("vllm:"):]: None for attr in REPORTED})
    engine = EngineMetrics.from_text(text)
    metrics = {SERIES[attr][0][len("vllm:"):]: getattr(engine, attr) for attr in REPORTED}
    module.exit_json(changed=False, reachable=True, in_flight=engine.in_flight, missing=engine.missing,
                     metrics=metrics)


if __name__ == "__main__":
    main()
