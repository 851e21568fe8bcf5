#!/usr/bin/python
"""vllm_metrics: read a vLLM instance's Prometheus metrics."""

DOCUMENTATION = r"""
module: vllm_metrics
short_description: Read the load and progress of a vLLM instance from its /metrics
description:
  - Fetches a vLLM server's C(/metrics) and returns the V1 series a rollout decides on, each
    summed over its C(model_name)/C(engine) label sets.
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
  - vllm-fleet contributors
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
  description: Requests running plus waiting (null when unreachable).
  type: float
  returned: always
metrics:
  description: The series that matter, summed over label sets; null where absent.
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

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import metric_sum, parse_prometheus

SERIES = ("num_requests_running", "num_requests_waiting", "generation_tokens_total",
          "prompt_tokens_total", "kv_cache_usage_perc", "num_preemptions_total")


def main():
    module = AnsibleModule(
        argument_spec=dict(url=dict(type="str", required=True), timeout=dict(type="int", default=10)),
        supports_check_mode=True,
    )
    try:
        text = open_url(module.params["url"], timeout=module.params["timeout"]).read().decode("utf-8", "replace")
    except Exception as exc:  # refused, timeout, HTTP error: all mean "not serving now"
        module.exit_json(changed=False, reachable=False, error=str(exc), in_flight=None,
                         metrics={name: None for name in SERIES})
    series = parse_prometheus(text)
    metrics = {name: metric_sum(series, f"vllm:{name}") for name in SERIES}
    in_flight = sum(metrics[n] or 0.0 for n in ("num_requests_running", "num_requests_waiting"))
    module.exit_json(changed=False, reachable=True, in_flight=in_flight, metrics=metrics)


if __name__ == "__main__":
    main()
