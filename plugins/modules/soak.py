#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: soak
short_description: Soak one vLLM instance under load on the node and return a pass/fail verdict
version_added: "0.1.0"
description:
  - Runs the whole soak B(on the node), so launch it with C(async) and C(poll) set to 0; it then
    runs detached under Ansible's async wrapper and survives a dropped connection. Read its
    progress with M(vllm_fleet.fleet.soak_status) and its result with
    M(ansible.builtin.async_status).
  - "Load: C(<venv>/bin/vllm bench serve) (random dataset, O(concurrency) clients,
    O(input_len) tokens in, O(output_len) out, C(--ignore-eos)), run after run until
    O(duration_s); each run is sized to last about O(run_s) seconds and uses a new seed,
    so the prefix cache does not serve repeated prompts."
  - "Watch, every O(sample_interval_s): C(/health), C(/metrics),
    C(systemctl show) (C(NRestarts), C(MainPID), C(ActiveState)) and the unit's journal
    (read by cursor, each line once)."
  - "Crash: NRestarts went up, MainPID changed, the unit left C(active), C(/health) answered
    503 or refused the connection, or a journal line matched O(journal_patterns). The soak
    stops at the first crash (fail fast) and keeps the CUDA error line as evidence."
  - "Wedge: requests in flight and no progress (generated tokens and requests finished with
    C(stop), C(length) or C(repetition) both flat; a request finished with C(error) or C(abort)
    is no progress) for O(wedge_window_s) while C(/health) says 200, or C(/health) and C(/metrics) not
    answering at all. Arriving requests are not progress: prompt tokens counted on arrival
    and clients that time out and retry move while a wedged engine generates nothing; in
    flight rising meanwhile is part of the evidence."
  - "Metrics incomplete: C(/metrics) answers without C(vllm:num_requests_running),
    C(vllm:num_requests_waiting) or C(vllm:generation_tokens_total): the soak fails with
    'metrics incomplete: <names>' (a wedge cannot be told from idle), as the watchdog says."
  - "Load not delivered: the soak proves its load from both sides. The load runs must complete
    requests, and the server's own counters must show it, over the samples from the first that saw
    load to the end: tokens generated (C(vllm:generation_tokens_total) rising) in at least half of
    them, and C(vllm:num_requests_running) reaching 75% of O(concurrency) (rounded up). Otherwise the soak fails with 'Load not delivered: ...',
    naming the cause read from the bench's output: C(no_tokenizer) (missing, or not readable by
    O(run_as)), C(unauthorized) (a wrong O(api_key)), C(wrong_model) (a name the server does not
    serve), C(could_not_connect), C(unknown) (the log's last lines quoted); or the server side:
    C(no_run_finished), C(no_request), C(no_metrics), C(not_generating),
    C(concurrency_not_reached)."
  - "Before any load, O(run_as) must be able to read the tokenizer directory (O(tokenizer), else
    O(model) when it is a path): else the soak fails at once with the no_tokenizer cause."
  - "The bench (third-party code, as O(run_as)) saves its results in a directory of its own under
    O(scratch_dir), made for this soak, mode 0700. The module reads each result back without
    trusting it (a symlink is refused, never followed; only a regular file of one link and at most
    1 MiB) and keeps the summary, and each run's log, in O(state_dir)C(/bench). Without
    C(--save-detailed) the real bench's result has no per-request errors: they are read from its
    log. The scratch directory is removed at the end."
  - Performance of the finished load runs against O(baseline) within O(tolerances); the
    KV cache peak from C(vllm:kv_cache_usage_perc).
  - "Writes C(progress.jsonl) (one line per sample) and C(verdict.json) (once, at the end)
    to O(state_dir). The verdict says what the soak proved: with zero crashes in T minutes,
    the crash rate is below -ln(0.05)/T (about 3/T) per minute at 95% confidence; with a
    O(target_mtbf_hours), whether the soak was long enough and how long one must be."
options:
  unit:
    description: The serving unit to soak, for example C(vllm@gpu0).
    type: str
    required: true
  base_url:
    description: Where the instance serves (C(/health), C(/metrics), C(/v1/completions)).
    type: str
    default: http://127.0.0.1:8000
  venv:
    description:
      - The release venv whose C(bin/vllm) generates the load, for example
        C(/opt/vllm-fleet/releases/<id>).
    type: path
    required: true
  model:
    description:
      - Passed to C(vllm bench serve --model) (the model path also names the tokenizer).
        Omitted, the bench uses the first model the server lists.
    type: str
  served_model_name:
    description: Passed to C(vllm bench serve --served-model-name) when the server serves another name.
    type: str
  tokenizer:
    description:
      - Passed to C(vllm bench serve --tokenizer), a local directory O(run_as) can read. Omitted, the bench
        loads its tokenizer from O(model). Checked as O(run_as) before any load when it is a path.
    type: str
  duration_s:
    description: How long to soak, in seconds, unless a crash or wedge ends it earlier.
    type: float
    required: true
  min_duration_s:
    description:
      - The shortest soak that may pass. A soak that stops earlier for any other reason
        fails. Must not exceed O(duration_s).
    type: float
    default: 0
  concurrency:
    description:
      - Concurrent clients (C(--max-concurrency)). The reference load is 32.
      - The server must show at least 75% of it running (C(vllm:num_requests_running)) in at least half of the
        samples with requests running, else the load was not delivered.
    type: int
    default: 32
  input_len:
    description: Prompt tokens per request (C(--random-input-len)). The reference load is 81000.
    type: int
    default: 81000
  output_len:
    description: Generated tokens per request (C(--random-output-len), with C(--ignore-eos)).
    type: int
    default: 256
  num_prompts:
    description:
      - Prompts per load run. Omitted, each run is sized from the last run's request rate
        (else the baseline's) to last about O(run_s), at most a third of O(duration_s) (so that
        runs finish within the soak, as a soak proves its load by finished runs), and never fewer
        than 2 x O(concurrency).
    type: int
  run_s:
    description: Target length of one load run, in seconds, when O(num_prompts) is omitted; at most a third of O(duration_s) is used.
    type: float
    default: 60
  bench_args:
    description: More arguments appended to C(vllm bench serve), for example C([--request-rate, "8"]).
    type: list
    elements: str
    default: []
  sample_interval_s:
    description: Seconds between samples (at most 10).
    type: float
    default: 2
  wedge_window_s:
    description: Seconds without progress, with requests in flight and C(/health) 200, that make a wedge.
    type: float
    default: 60
  evidence_grace_s:
    description:
      - After a crash seen by C(/health) or systemd, how long to wait for the CUDA error
        line to reach the journal before writing the verdict.
    type: float
    default: 5
  ready_timeout_s:
    description: How long to wait at the start for C(/health) 200 and the unit C(active).
    type: float
    default: 120
  http_timeout_s:
    description: Timeout of each C(/health) and C(/metrics) request.
    type: float
    default: 5
  baseline:
    description:
      - Expected performance. Keys are C(vllm bench serve) result keys
        (C(total_token_throughput), C(output_throughput), C(request_throughput) in per
        second; C(mean_tpot_ms), C(median_tpot_ms), C(p99_tpot_ms) and the same for
        C(ttft), C(itl) in ms) and C(kv_cache_peak) (0-1, the peak of
        C(vllm:kv_cache_usage_perc)), each a number above 0. An unknown key fails the task.
      - Throughputs pass at or above baseline x (1 - tolerance); latencies at or below
        baseline x (1 + tolerance); C(kv_cache_peak) at or below baseline + tolerance.
      - Omitted, performance is recorded but not judged.
    type: dict
    default: {}
  tolerances:
    description:
      - Per metric of O(baseline), a fraction with 0 < t < 0.5 (C(0.05) = 5%; for
        C(kv_cache_peak), fraction points); anything else fails the task. Defaults 0.05
        for throughputs, 0.10 for mean/median TPOT and ITL, 0.20 for TTFT and p99 latencies,
        0.30 for p99 TTFT, 0.05 for C(kv_cache_peak).
    type: dict
    default: {}
  max_failed_requests:
    description: Failed requests (from the load runs) the soak tolerates.
    type: int
    default: 0
  target_mtbf_hours:
    description:
      - A mean time between crashes to demonstrate at O(confidence). The verdict then says
        whether the soak was long enough (C(long_enough) in RV(soak.proof)) and how many minutes
        without a crash one must be (C(required_minutes) there). It does not fail the
        soak by itself.
    type: float
  confidence:
    description: Confidence of the crash-rate bound.
    type: float
    default: 0.95
  journal_patterns:
    description: Regular expressions; a journal line of the unit that matches one is a crash.
    type: list
    elements: str
    default: ["illegal memory access", "misaligned address", "EngineDeadError", "CUDA error"]
  api_key:
    description: The server's API key, given to the load generator as C(OPENAI_API_KEY) (never on a command line).
    type: str
  run_as:
    description:
      - Run the load generator (the release's C(vllm bench serve), third-party code) as this user, with its own
        group and no other, instead of as the user that runs the module (root). It must exist and be able to read
        the release and the model's tokenizer. It gets a directory of its own under O(scratch_dir) for its results
        and as its C(HOME).
    type: str
  scratch_dir:
    description:
      - A directory of root's, outside any release, under which each soak gets the bench's own directory (new,
        mode 0700, O(run_as)'s). Made mode 0711 when missing; one that is a symlink, not root's or writable by
        group or others fails the task. The default is on tmpfs.
    type: path
    default: /run/vllm-fleet-soak
  state_dir:
    description:
      - Where the soak writes C(progress.jsonl), C(verdict.json) and C(bench/) (each load
        run's summary and log, root's), for example C(<release>/soak/<run>). Created if missing;
        one that already holds a soak's files fails the task.
    type: path
    required: true
  fail_on_verdict:
    description: Fail the task when the soak fails (the verdict is returned either way).
    type: bool
    default: true
notes:
  - Run it with C(async) longer than O(ready_timeout_s) + O(duration_s) + a minute, and
    C(poll) 0; in check mode run it without C(async); it returns the plan and runs nothing.
  - The crash-rate bound is per minute of I(this) load. A crash whose rate grows with load
    (the sm_120 cuDNN one fires per batch) is rarer under lighter traffic.
requirements:
  - systemd (C(systemctl), C(journalctl)) on the node; the release venv with C(vllm).
seealso:
  - module: vllm_fleet.fleet.soak_status
  - module: ansible.builtin.async_status
attributes:
  check_mode:
    support: full
    description: Returns the plan (load command, files) and puts no load on the node.
  diff_mode:
    support: none
    description: Nothing to diff.
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Soak the canary for 50 minutes under the reference load (detached)
  vllm_fleet.fleet.soak:
    unit: vllm@gpu0
    base_url: http://127.0.0.1:8000
    venv: /opt/vllm-fleet/releases/{{ release_id }}
    model: /models/qwen3.6-35b-a3b-nvfp4
    duration_s: 3000
    min_duration_s: 1800
    baseline:
      total_token_throughput: 14200
      mean_tpot_ms: 41
      kv_cache_peak: 0.43
    tolerances:
      total_token_throughput: 0.05
    target_mtbf_hours: 8
    state_dir: /opt/vllm-fleet/releases/{{ release_id }}/soak/{{ run_id }}
  async: 3300
  poll: 0
  register: soak_job

- name: Report progress until the soak is done
  vllm_fleet.fleet.soak_status:
    state_dir: /opt/vllm-fleet/releases/{{ release_id }}/soak/{{ run_id }}
    wait_s: 20
  register: soak_progress

- name: Collect the verdict (fails the host when the soak failed)
  ansible.builtin.async_status:
    jid: "{{ soak_job.ansible_job_id }}"
  register: soak_result
  until: soak_result.finished
  retries: 30
  delay: 2
"""

RETURN = r"""
soak:
  description:
    - The verdict (also in C(state_dir/verdict.json)). Returned when the task fails
      because the soak failed, too. In check mode, RV(soak.plan) only.
  returned: always
  type: dict
  contains:
    passed:
      description: The soak passed.
      type: bool
      sample: false
    summary:
      description: One sentence.
      type: str
      sample: "Soak failed after 7.9 s: The engine crashed 7.1 s into the soak (health_503): torch.AcceleratorError: ..."
    reasons:
      description:
        - "Why it failed, one sentence each; empty when it passed. A figure off its baseline reads like
          C(total_token_throughput: 12,160 tokens/s is 6.9% below the baseline 13,060 (tolerance 5%).)"
      type: list
      elements: str
    notes:
      description: Things worth knowing that do not fail the soak (target MTBF not reached yet, no baseline).
      type: list
      elements: str
    stopped:
      description:
        - V(completed), V(crash), V(wedge), V(metrics_incomplete), V(failed_requests), V(load_error) (two load runs
          in a row completed no request, or the tokenizer check failed) or V(interrupted).
      type: str
    duration_s:
      description: Seconds the soak ran (until the last sample).
      type: float
    crashes:
      description:
        - Each with C(kind) (the first signal), C(time) (when the engine died, by the journal
          if it logged it), C(elapsed_s), C(detected_at), C(detection_latency_s), C(signals),
          C(evidence) (the CUDA error line when there is one) and C(journal) (matched lines).
      type: list
      elements: dict
    wedges:
      description: Each with C(kind) (V(no_progress), V(unresponsive)), C(since_elapsed_s), C(flat_for_s), C(evidence).
      type: list
      elements: dict
    failed_requests:
      description: Failed requests reported by the finished load runs.
      type: int
    performance:
      description:
        - C(metrics) (per baseline key C(observed), C(baseline), C(tolerance), C(limit),
          C(passed)), C(passed), C(unmeasured), C(source) (V(bench) or V(metrics)).
      type: dict
    kv_cache_peak:
      description: Highest C(vllm:kv_cache_usage_perc) seen (0-1).
      type: float
    tokens_per_s:
      description:
        - Prompt + generated tokens per second of the finished load runs, recomputed from their token totals over
          their duration (else the server's count); what the gate judged.
      type: float
    bench_tokens_per_s:
      description: The bench's own C(total_token_throughput), duration-weighted over the runs; null when it reported none.
      type: float
    throughput:
      description:
        - Both figures side by side. C(gate_used) (V(bench_totals) or V(server_metrics)), C(recomputed)
          (= RV(soak.tokens_per_s) when from the runs), C(reported) (= RV(soak.bench_tokens_per_s)).
      type: dict
    proof:
      description:
        - What the soak proved. C(crash_rate_upper_per_min) and C(mtbf_lower_hours) at
          C(confidence), C(statement), and with a target C(target_mtbf_hours),
          C(long_enough), C(required_minutes), C(remaining_minutes), C(target_statement).
        - A failed soak (crash, wedge, metrics incomplete, anything) proves nothing; C(statement),
          C(crash_rate_upper_per_min) and C(mtbf_lower_hours) are null, C(long_enough) is false and
          C(not_proved) says why.
      type: dict
      sample:
        confidence: 0.95
        minutes: 60.0
        crashes: 0
        crash_rate_upper_per_min: 0.0499
        mtbf_lower_hours: 0.334
        target_mtbf_hours: 8
        long_enough: false
        required_minutes: 1438
        remaining_minutes: 1378
    load:
      description:
        - The load. C(shape) (concurrency, input and output lengths); C(runs), the load runs that completed
          requests; C(aggregate), their numbers together (null when none).
        - C(proof), whether the load was delivered. C(delivered), C(cause) (the first thing missing, see the
          description), C(reason) (the sentence in RV(soak.reasons)), C(runs_completed), C(requests_completed),
          C(failed_runs) (the last three runs that completed nothing, each C(run), C(exit_status), C(cause),
          C(message)) and C(server) (what the counters showed, C(arrived_elapsed_s), C(samples),
          C(generating_samples), C(busy_samples), C(concurrency_threshold), C(concurrent_samples),
          C(peak_running)).
      type: dict
      sample:
        runs: 0
        proof:
          delivered: false
          cause: unauthorized
          reason: "Load not delivered: no load run completed a request (2 run(s) failed); unauthorised: the server
            refused the load generator's API key (401 Unauthorized): give the soak the key the server was started
            with (api_key) (8 request(s) failed: 8 x Unauthorized); the server saw no request during the soak
            (check base_url, model and the load generator's log under bench/)."
    monitor:
      description: Samples taken, interval, and the monitor's own CPU use.
      type: dict
    plan:
      description: In check mode, what would run (the load command, the files).
      type: dict
      returned: check mode
"""

import os
import signal
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import SoakConfig, SoakError, run_soak
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_bench import (
    DEFAULT_SCRATCH_DIR,
    bench_command,
    next_num_prompts,
    run_length_s,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_monitor import DEFAULT_JOURNAL_PATTERNS
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import SoakConfigError

OPTIONS = dict(
    unit=dict(type="str", required=True),
    base_url=dict(type="str", default="http://127.0.0.1:8000"),
    venv=dict(type="path", required=True),
    model=dict(type="str"),
    served_model_name=dict(type="str"),
    tokenizer=dict(type="str", no_log=False),  # a model name, not a token
    duration_s=dict(type="float", required=True),
    min_duration_s=dict(type="float", default=0),
    concurrency=dict(type="int", default=32),
    input_len=dict(type="int", default=81000),
    output_len=dict(type="int", default=256),
    num_prompts=dict(type="int"),
    run_s=dict(type="float", default=60),
    bench_args=dict(type="list", elements="str", default=[]),
    sample_interval_s=dict(type="float", default=2),
    wedge_window_s=dict(type="float", default=60),
    evidence_grace_s=dict(type="float", default=5),
    ready_timeout_s=dict(type="float", default=120),
    http_timeout_s=dict(type="float", default=5),
    baseline=dict(type="dict", default={}),
    tolerances=dict(type="dict", default={}),
    max_failed_requests=dict(type="int", default=0),
    target_mtbf_hours=dict(type="float"),
    confidence=dict(type="float", default=0.95),
    journal_patterns=dict(type="list", elements="str", default=list(DEFAULT_JOURNAL_PATTERNS)),
    api_key=dict(type="str", no_log=True),
    run_as=dict(type="str"),
    scratch_dir=dict(type="path", default=DEFAULT_SCRATCH_DIR),
    state_dir=dict(type="path", required=True),
    fail_on_verdict=dict(type="bool", default=True),
)


def main():
    module = AnsibleModule(argument_spec=OPTIONS, supports_check_mode=True)
    params = {k: v for k, v in module.params.items() if k != "fail_on_verdict"}
    cfg = SoakConfig(**params)
    try:
        cfg.validate()
    except SoakConfigError as exc:
        module.fail_json(msg=f"soak: {exc}")

    if module.check_mode:
        scratch = f"{cfg.scratch_dir}/{os.path.basename(os.path.normpath(cfg.state_dir))}-XXXXXXXX"
        n = cfg.num_prompts or next_num_prompts(concurrency=cfg.concurrency, input_len=cfg.input_len,
                                                output_len=cfg.output_len,
                                                run_s=run_length_s(cfg.run_s, cfg.duration_s), baseline=cfg.baseline)
        plan = {
            "unit": cfg.unit,
            "base_url": cfg.base_url,
            "duration_s": cfg.duration_s,
            "load_command": bench_command(cfg, n, 1, scratch, "run-001.raw.json"),
            "state_dir": cfg.state_dir,
            "files": [f"{cfg.state_dir}/progress.jsonl", f"{cfg.state_dir}/verdict.json", f"{cfg.state_dir}/bench/",
                      f"{scratch}/ (removed at the end)"],
        }
        module.exit_json(changed=False, soak={"plan": plan},
                         msg=f"check mode: would soak {cfg.unit} for {cfg.duration_s:g} s; no load was run")

    stop = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda sig, frame: stop.append(sig))
    try:
        result = run_soak(cfg, should_stop=lambda: bool(stop))
    except (SoakError, SoakConfigError) as exc:
        module.fail_json(msg=f"soak: {exc}")
    except Exception as exc:  # the soak's own bug: say where the files are
        module.fail_json(msg=f"soak of {cfg.unit} broke: {type(exc).__name__}: {exc} (files in {cfg.state_dir})",
                         exception=traceback.format_exc())

    if not result["passed"] and module.params["fail_on_verdict"]:
        module.fail_json(
            msg=f"{cfg.unit}: {result['summary']} Verdict: {cfg.state_dir}/verdict.json. Keep this release out of "
                "traffic and roll the node back; the reasons say what to fix.",
            soak=result, changed=True)
    module.exit_json(changed=True, soak=result, msg=result["summary"])


if __name__ == "__main__":
    main()
