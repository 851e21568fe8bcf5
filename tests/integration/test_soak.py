"""The soak gate on a simulated node: the stand-in vLLM 0.25.1 served by a real systemd
unit (Restart=always) from release venvs installed offline on the node, the soak module
launched through ansible-playbook with async/poll 0 and followed with soak_status.

Measured here (junit properties and stdout): time from an injected crash or wedge to the
failed verdict, and the monitor's CPU use during a soak.

The passing soak and the unauthorised one run the load as the role does: as the probe user
(nobody), its results in a scratch directory outside the release. The stand-in bench needs a
tokenizer as the real one does; simnode writes one at each shipped profile's model path.
"""
from __future__ import annotations

import json
import os
import sys
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.simnode import simnode
from tests.fixtures.wheels.build import build_node_wheelhouse
from tests.integration.playbook import ROOT, ansible_playbook

PLAYBOOK = "tests/integration/soak_playbooks/soak.yml"
UNIT = "vllm@gpu0"
RELEASES = {"good": "9.24.0.43", "bad": "9.19.0.56"}  # bad: torch's own pin, the crashing cuDNN
MODEL = "/models/qwen3.6-35b-a3b-nvfp4"
PREFIX = f"vf-test-{os.getpid()}-soak-"
# A minimal serving unit for these tests; the real one comes from the vllm_service role.
# ExecStart runs vllm itself (no shell), so `systemctl kill -s SIGUSR1` reaches only it.
UNIT_FILE = """[Unit]
Description=stand-in vLLM %i (soak test unit)

[Service]
Type=simple
EnvironmentFile=/etc/vllm-fleet/%i.env
ExecStart=/opt/vllm-fleet/current/bin/vllm serve ${VLLM_MODEL} --port ${VLLM_PORT} --max-model-len 8192 --kv-cache-dtype fp8 $VLLM_ARGS
Restart=always
RestartSec=1
"""
# Scaled down: 4 clients x 512 in / 48 out, one sample a second, a 5 s wedge window.
SHAPE = {"concurrency": 4, "input_len": 512, "output_len": 48, "run_s": 6, "sample_interval_s": 1,
         "wedge_window_s": 5, "ready_timeout_s": 30}
# Each held token weighs 1000 in the KV gauge, so the small load shows a real KV level.
STANDIN_ENV = {"VLLM_STANDIN_LOAD_SECONDS": "1", "VLLM_STANDIN_KV_TOKEN_SCALE": "1000"}
# As the role runs the load: as vllm_fleet_probe_user, its results under the soak module's default scratch_dir.
AS_PROBE_USER = {"run_as": "nobody"}
SCRATCH = "/run/vllm-fleet-soak"
# Streaming clients that may time out and retry (one load client for the watchdog scenario and here).
VF_LOAD = ROOT / "molecule" / "vllm_watchdog" / "files" / "vf-load"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_wheelhouse(out: Path) -> Path:
    """torch/cuDNN stand-ins, the stand-in vllm wheel, nvidia-ml-py, pyyaml (and uv)."""
    return build_node_wheelhouse(out)


INSTALL = """set -e
WH=/srv/wheelhouse
if ls $WH/uv-*.whl >/dev/null 2>&1; then
  python3 -c "import glob, zipfile; z = zipfile.ZipFile(sorted(glob.glob('$WH/uv-*.whl'))[0]); \
name = [n for n in z.namelist() if n.endswith('/scripts/uv')][0]; open('/usr/local/bin/uv', 'wb').write(z.read(name))"
  chmod 755 /usr/local/bin/uv
fi
mkdir -p /opt/vllm-fleet/releases /etc/vllm-fleet
for spec in {releases}; do
  rel=${{spec%%=*}}; cudnn=${{spec#*=}}; R=/opt/vllm-fleet/releases/$rel
  echo "nvidia-cudnn-cu13==$cudnn" > /tmp/override-$rel.txt
  if command -v uv >/dev/null; then
    uv --no-config venv -q $R
    uv --no-config pip install -q --python $R/bin/python --no-index --find-links $WH \
      --override /tmp/override-$rel.txt vllm==0.25.1
  else
    python3 -m venv $R
    PIP_CONFIG_FILE=/dev/null $R/bin/pip install -q --no-index --find-links $WH vllm==0.25.1
    PIP_CONFIG_FILE=/dev/null $R/bin/pip install -q --no-index --find-links $WH --no-deps nvidia-cudnn-cu13==$cudnn
  fi
  $R/bin/python -c "import torch; print('$rel', torch.backends.cudnn.version())"
done
"""


class SoakNode:
    def __init__(self, node: simnode.Node, inventory: Path, port: int):
        self.node, self.inventory, self.port = node, inventory, port
        self.base_url = f"http://127.0.0.1:{port}"

    def sh(self, cmd: str, timeout: float = 60) -> str:
        result = self.node.exec(cmd, timeout=timeout)
        assert result.returncode == 0, f"{cmd}\n{result.stdout}{result.stderr}"
        return result.stdout

    def serve(self, release: str, **knobs: str) -> None:
        """Point `current` at a release and (re)start the unit with these stand-in knobs."""
        env = {"VLLM_MODEL": MODEL, "VLLM_PORT": str(self.port), "VLLM_ARGS": "", **STANDIN_ENV, **knobs}
        self.node.exec("cat > /etc/vllm-fleet/gpu0.env", input="".join(f"{k}={v}\n" for k, v in env.items()))
        self.sh(f"ln -sfn /opt/vllm-fleet/releases/{release} /opt/vllm-fleet/current && "
                f"systemctl daemon-reload && systemctl restart {UNIT}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            code = self.node.exec(f"curl -s -o /dev/null -w '%{{http_code}}' {self.base_url}/health").stdout
            if code == "200":
                return
            time.sleep(0.3)
        raise AssertionError(f"{UNIT} never answered /health 200:\n{self.journal(40)}")

    def journal(self, lines: int = 60) -> str:
        return self.node.exec(f"journalctl -u {UNIT} --no-pager -n {lines}").stdout

    def read_json(self, path: str):
        result = self.node.exec(f"cat {path}")
        return json.loads(result.stdout) if result.returncode == 0 else None

    def progress(self, state_dir: str) -> list[dict]:
        text = self.node.exec(f"cat {state_dir}/progress.jsonl").stdout
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def soak(self, release: str, run: str, **params):
        state_dir = f"/opt/vllm-fleet/releases/{release}/soak/{run}"
        soak = {"unit": UNIT, "base_url": self.base_url, "venv": f"/opt/vllm-fleet/releases/{release}",
                "model": MODEL, "state_dir": state_dir, **SHAPE, **params}
        started = time.time()
        result = ansible_playbook(PLAYBOOK, self.inventory, extra_vars={"soak": soak, "soak_poll_s": 3}, timeout=300)
        return result, state_dir, started, time.time()


@pytest.fixture(scope="module")
def soak_node(node_image, fake_nvml_lib, tmp_path_factory):
    from tests.fixtures.nvml.build import PROFILES_DIR

    wheelhouse = node_wheelhouse(tmp_path_factory.mktemp("node-wheelhouse"))
    node = simnode.start_node("soak", nvml_lib=fake_nvml_lib, nvml_profile=PROFILES_DIR / "rtx_pro_6000.conf",
                              image=node_image, prefix=PREFIX)
    try:
        subprocess.run(["podman", "cp", str(wheelhouse), f"{node.container}:/srv/wheelhouse"], check=True)
        releases = " ".join(f"{rel}={cudnn}" for rel, cudnn in RELEASES.items())
        result = node.exec(INSTALL.format(releases=releases), timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "good 92400" in result.stdout and "bad 91900" in result.stdout, result.stdout
        node.exec("cat > /etc/systemd/system/vllm@.service", input=UNIT_FILE)
        inventory = simnode.write_inventory([node], tmp_path_factory.mktemp("soak") / "inventory.yml")
        yield SoakNode(node, inventory, free_port())
    finally:
        simnode.remove_nodes(PREFIX)


def proc_cpu(node: SoakNode, pid: int) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of reaped children) of a node process, from /proc."""
    fields = node.sh(f"cat /proc/{pid}/stat").rsplit(")", 1)[1].split()
    tick = int(node.sh("getconf CLK_TCK"))
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def wait_for_progress(node: SoakNode, state_dir: str, elapsed: float, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [p for p in node.progress(state_dir) if p.get("phase") == "soak"]
        if lines and lines[-1]["elapsed_s"] >= elapsed:
            return lines[-1]
        time.sleep(0.3)
    raise AssertionError(f"the soak never reached {elapsed} s: {node.progress(state_dir)[-3:]}")


def test_a_stable_release_passes_with_progress_and_statistics(soak_node, record_property):
    soak_node.serve("good")
    cpu = {}
    state_dir = "/opt/vllm-fleet/releases/good/soak/pass"

    def measure():  # the monitor's CPU over the middle of the soak, from /proc of the async job
        first = wait_for_progress(soak_node, state_dir, 3)
        a, t_a = proc_cpu(soak_node, first["pid"]), time.monotonic()
        # Well before the 20 s end: on a loaded machine each podman exec can take a second, and
        # a read at 18 s once found the job already gone.
        wait_for_progress(soak_node, state_dir, 12)
        b, t_b = proc_cpu(soak_node, first["pid"]), time.monotonic()
        cpu.update(self_pct=100 * (b[0] - a[0]) / (t_b - t_a), wall_s=t_b - t_a)

    watcher = threading.Thread(target=measure, daemon=True)
    watcher.start()
    run, state_dir, _, _ = soak_node.soak(
        "good", "pass", duration_s=20, min_duration_s=15, target_mtbf_hours=8, **AS_PROBE_USER,
        # Tolerances below 0.5 (the soak refuses anything else): the same floors as before.
        baseline={"total_token_throughput": 1360, "mean_tpot_ms": 26, "kv_cache_peak": 0.40},
        tolerances={"total_token_throughput": 0.45, "mean_tpot_ms": 0.45, "kv_cache_peak": 0.2})
    watcher.join(30)

    assert run.rc == 0, run.output[-4000:]
    verdict = soak_node.read_json(f"{state_dir}/verdict.json")
    assert verdict["passed"] is True, verdict["reasons"]
    assert verdict["stopped"] == "completed" and 20 <= verdict["duration_s"] < 22
    assert verdict["crashes"] == [] and verdict["wedges"] == [] and verdict["failed_requests"] == 0
    perf = verdict["performance"]
    assert perf["source"] == "bench" and perf["passed"] and perf["unmeasured"] == []
    assert set(perf["metrics"]) == {"total_token_throughput", "mean_tpot_ms", "kv_cache_peak"}
    assert 0.05 < verdict["kv_cache_peak"] < 0.6 and verdict["tokens_per_s"] > 500
    # The load runs finished and were read (the bench, as nobody, could save its results), and the
    # server's own counters showed the load: what a soak that passed on /metrics alone lacked.
    load = verdict["load"]
    assert load["runs"] >= 2 and load["aggregate"]["failed"] == 0 and load["aggregate"]["completed"] > 0
    assert verdict["bench_tokens_per_s"] > 0 and verdict["throughput"]["gate_used"] == "bench_totals"
    assert load["proof"]["delivered"] is True and load["proof"]["failed_runs"] == [], load["proof"]
    server = load["proof"]["server"]
    assert server["concurrent_samples"] > 0 and server["peak_running"] >= 3, server
    assert server["generating_samples"] >= server["samples"] / 2, server
    print(f"\nload: {load['runs']} runs, {load['aggregate']['completed']} requests; server: {server}")
    # Nothing under the release is the bench's, and its scratch directory is gone.
    assert soak_node.sh(f"find {state_dir} -user nobody") == ""
    assert soak_node.sh(f"ls -A {SCRATCH}") == ""
    proof = verdict["proof"]
    assert proof["crashes"] == 0
    assert proof["crash_rate_upper_per_min"] == pytest.approx(2.995732 * 60 / verdict["duration_s"], rel=1e-3)
    assert proof["target_mtbf_hours"] == 8 and proof["long_enough"] is False and proof["required_minutes"] == 1438
    # progress: printed by the playbook while the soak ran, every sample on the node
    printed = [line for line in run.output.splitlines() if "soak progress vllm@gpu0" in line]
    assert len(printed) >= 3, run.output[-3000:]
    assert "verdict: passed" in run.output
    lines = [p for p in soak_node.progress(state_dir) if p["phase"] == "soak"]
    assert len(lines) >= 19 and max(b["t"] - a["t"] for a, b in zip(lines, lines[1:])) < 30
    assert all({"elapsed_s", "tokens_per_s", "crashes", "wedges", "failed"} <= set(p) for p in lines)
    # the bench runs kept their summaries, without per-request arrays
    summary = soak_node.read_json(f"{state_dir}/bench/run-001.json")
    assert summary["completed"] > 0 and "ttfts" not in summary

    monitor = verdict["monitor"]
    record_property("soak_monitor_cpu_percent_verdict", monitor["cpu_percent_of_one_core"])
    record_property("soak_monitor_cpu_percent_proc", round(cpu.get("self_pct", -1), 2))
    print(f"\nmonitor CPU: {monitor['cpu_self_s']} s self + {monitor['cpu_probes_s']} s probes over "
          f"{verdict['duration_s']} s = {monitor['cpu_percent_of_one_core']}% of one core (verdict); "
          f"/proc of the async job: {cpu.get('self_pct', float('nan')):.2f}% over {cpu.get('wall_s', 0):.1f} s")
    assert cpu, "the CPU of the async job was not measured"
    assert monitor["cpu_percent_of_one_core"] < 15 and cpu["self_pct"] < 10


def test_a_soak_whose_load_is_refused_fails_as_load_not_delivered_unauthorised(soak_node):
    """Negative control of the load's proof: the server requires a key, the soak is given another.
    The bench runs and exits 0 with every request failed (as the real one does): before, such a soak
    passed on /metrics alone; now it fails at once with the cause."""
    soak_node.serve("good", VLLM_ARGS="--api-key sk-soak-right")
    run, state_dir, _, _ = soak_node.soak("good", "wrong-key", duration_s=60, min_duration_s=10,
                                          api_key="sk-soak-wrong", **AS_PROBE_USER)
    assert run.rc != 0 and "Load not delivered" in run.output
    verdict = soak_node.read_json(f"{state_dir}/verdict.json")
    assert verdict["passed"] is False and verdict["stopped"] == "load_error" and verdict["duration_s"] < 40
    proof = verdict["load"]["proof"]
    assert proof["cause"] == "unauthorized" and verdict["load"]["runs"] == 0, proof
    assert verdict["reasons"][0].startswith("Load not delivered: no load run completed a request (2 run(s) failed); "
                                            "unauthorised: the server refused the load generator's API key")
    assert "x Unauthorized" in verdict["reasons"][0] and "sk-soak" not in json.dumps(verdict)
    assert soak_node.sh(f"ls -A {SCRATCH}") == ""


def test_a_tokenizer_the_probe_user_cannot_read_fails_before_any_load(soak_node):
    """The soak checks, as the probe user, that the bench can read its tokenizer (the model path)
    before it starts any load: a model directory only root may enter fails at once, by name."""
    soak_node.serve("good")
    mode = soak_node.sh(f"stat -c %a {MODEL}").strip()
    soak_node.sh(f"chmod 700 {MODEL}")
    try:
        run, state_dir, _, _ = soak_node.soak("good", "no-tokenizer", duration_s=60, min_duration_s=10,
                                              **AS_PROBE_USER)
    finally:
        soak_node.sh(f"chmod {mode} {MODEL}")
    assert run.rc != 0 and "Load not delivered: no tokenizer" in run.output, run.output[-3000:]
    verdict = soak_node.read_json(f"{state_dir}/verdict.json")
    assert verdict["stopped"] == "load_error" and verdict["duration_s"] == 0 and verdict["monitor"]["samples"] == 0
    assert verdict["load"]["proof"]["cause"] == "no_tokenizer"
    assert f"loads its tokenizer from {MODEL} and user nobody cannot read it" in verdict["reasons"][0]
    assert "Permission denied" in verdict["reasons"][0]
    assert soak_node.sh(f"ls -A {state_dir}").split() == ["progress.jsonl", "verdict.json"]  # no bench ran


def test_the_crashing_cudnn_fails_at_the_first_crash_with_the_cuda_line(soak_node, record_property):
    # Seed 19 draws the crash at batch 340 (of mean 300): ~6 s into the load at 18 ms a step.
    soak_node.serve("bad", VLLM_STANDIN_MEAN_STEPS_TO_CRASH="300", VLLM_STANDIN_SEED="19")
    assert "cuDNN 91900 as loaded by torch" in soak_node.journal(40)

    run, state_dir, started, ended = soak_node.soak("bad", "crash", duration_s=60, min_duration_s=30)

    assert run.rc != 0
    assert "Soak failed" in run.output and "CUDA error" in run.output and "roll the node back" in run.output
    verdict = soak_node.read_json(f"{state_dir}/verdict.json")
    assert verdict["passed"] is False and verdict["stopped"] == "crash"
    [crash] = verdict["crashes"]
    assert "CUDA error: an illegal memory access" in crash["evidence"] or "misaligned address" in crash["evidence"]
    assert "torch.AcceleratorError" in crash["evidence"]
    assert any("EngineDeadError" in line for line in crash["journal"])
    assert {s["kind"] for s in crash["signals"]} >= {"cuda_error"}
    assert 2 < crash["elapsed_s"] and verdict["duration_s"] < 30  # fail fast: far short of the 60 s soak
    assert "CUDA error" in verdict["reasons"][0]
    assert verdict["proof"]["crashes"] == 1
    # no load left running on the node
    assert "bench serve" not in soak_node.sh("ps -eo args")

    crash_t = _epoch(crash["time"])
    to_verdict = _epoch(verdict["finished_at"]) - crash_t
    to_playbook = ended - crash_t
    record_property("crash_to_verdict_s", round(to_verdict, 2))
    record_property("crash_to_failed_playbook_s", round(to_playbook, 2))
    print(f"\ncrash at {crash['elapsed_s']} s into the soak; detected {crash['detection_latency_s']} s later; "
          f"verdict written {to_verdict:.2f} s after the crash; playbook failed {to_playbook:.2f} s after it "
          f"(whole playbook {ended - started:.1f} s)")
    assert crash["detection_latency_s"] <= 2.5
    assert to_verdict < 8


def wedge_mid_soak(soak_node: SoakNode, state_dir: str, then=None) -> tuple[threading.Thread, dict]:
    """A thread that wedges the stand-in (SIGUSR1) 3 s into the soak, then calls then(injected);
    injected["t"]: when (epoch)."""
    injected = {}

    def inject():
        # The playbook starts the soak first: on a loaded machine that alone has taken most of a minute.
        wait_for_progress(soak_node, state_dir, 3, timeout=120)
        injected["t"] = time.time()
        soak_node.sh(f"systemctl kill -s SIGUSR1 {UNIT}")
        if then:
            then(injected)

    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    return injector, injected


def test_a_wedge_injected_mid_soak_fails_as_a_wedge(soak_node, record_property):
    soak_node.serve("good")
    state_dir = "/opt/vllm-fleet/releases/good/soak/wedge"
    injector, injected = wedge_mid_soak(soak_node, state_dir)
    run, state_dir, started, ended = soak_node.soak("good", "wedge", duration_s=60, min_duration_s=30)
    injector.join(10)

    assert "t" in injected, "the wedge was never injected: the soak did not reach 3 s in time"
    assert run.rc != 0 and "wedged" in run.output, run.output[-3000:]
    verdict = soak_node.read_json(f"{state_dir}/verdict.json")
    assert verdict["stopped"] == "wedge" and verdict["crashes"] == []
    [wedge] = verdict["wedges"]
    # requests in flight: running, or queued behind the stopped engine
    assert wedge["kind"] == "no_progress" and wedge["running"] + wedge["waiting"] > 0
    assert "while /health answers 200" in wedge["evidence"]
    assert "wedged" in verdict["reasons"][0]
    assert verdict["duration_s"] < 30

    to_verdict = _epoch(verdict["finished_at"]) - injected["t"]
    to_detect = _epoch(wedge["detected_at"]) - injected["t"]
    record_property("wedge_to_verdict_s", round(to_verdict, 2))
    record_property("wedge_to_failed_playbook_s", round(ended - injected["t"], 2))
    print(f"\nwedge injected; detected {to_detect:.2f} s later (window {SHAPE['wedge_window_s']} s, samples every "
          f"{SHAPE['sample_interval_s']} s); verdict {to_verdict:.2f} s; playbook failed "
          f"{ended - injected['t']:.2f} s after the injection")
    assert SHAPE["wedge_window_s"] - 1 <= to_detect <= SHAPE["wedge_window_s"] + 2 * SHAPE["sample_interval_s"] + 1


def test_clients_that_time_out_and_retry_do_not_hide_a_wedge(soak_node):
    """Beside the soak, clients that give up after 2 s and send again (vf-load, the watchdog
    scenario's load client), on a server that counts prompt tokens as requests arrive: once
    wedged, its prompt tokens and requests in flight keep rising while generation is flat,
    and the soak still fails as a wedge."""
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_progress import EngineMetrics

    soak_node.serve("good", VLLM_STANDIN_PROMPT_TOKENS_ON_ARRIVAL="1")
    soak_node.node.exec("cat > /usr/local/bin/vf-load && chmod 755 /usr/local/bin/vf-load", input=VF_LOAD.read_text())
    # 2 clients, 256 tokens a request (short ones: the KV gauge is scaled 1000x), 2 s timeout
    soak_node.sh(f"systemd-run --quiet --collect --unit=vf-load-retry /usr/local/bin/vf-load {soak_node.port} 2 256 2")
    state_dir = "/opt/vllm-fleet/releases/good/soak/wedge-retry"
    seen = {}

    def metrics():
        return EngineMetrics.from_text(soak_node.sh(f"curl -sf --max-time 5 {soak_node.base_url}/metrics"))

    def watch(_injected):  # the signal a rule counting arrivals would take for progress
        time.sleep(0.3)  # a step under way when the signal came may still finish
        seen["before"] = before = metrics()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            now = metrics()
            if now.prompt_tokens > before.prompt_tokens and now.in_flight > before.in_flight:
                seen["during"] = now
                return
            time.sleep(0.5)

    try:
        injector, _ = wedge_mid_soak(soak_node, state_dir, then=watch)
        run, state_dir, _, _ = soak_node.soak("good", "wedge-retry", duration_s=60, min_duration_s=30)
        injector.join(20)
    finally:
        soak_node.node.exec("systemctl stop vf-load-retry")

    before, during = seen["before"], seen.get("during")
    assert during is not None, f"prompt tokens and requests in flight never rose after the wedge: {before}"
    assert during.generation_tokens == before.generation_tokens and during.finished == before.finished
    assert run.rc != 0 and "wedged" in run.output, run.output[-3000:]
    verdict = soak_node.read_json(f"{state_dir}/verdict.json")
    assert verdict["passed"] is False and verdict["stopped"] == "wedge" and verdict["crashes"] == []
    assert "wedge" in verdict["reasons"][0]
    [wedge] = verdict["wedges"]
    assert wedge["kind"] == "no_progress" and "(rising from" in wedge["evidence"], wedge
    assert verdict["duration_s"] < 30
    print(f"\nwedged with retrying clients: prompt tokens {before.prompt_tokens:g} -> {during.prompt_tokens:g}, "
          f"in flight {before.in_flight:g} -> {during.in_flight:g}, generated tokens flat at "
          f"{during.generation_tokens:g}; soak: {wedge['evidence']}")


def test_the_soak_outlives_the_controller(soak_node):
    """async + poll 0: the soak runs on the node; killing ansible-playbook mid-soak
    (a dropped connection) does not stop it, and the verdict still lands on the node."""
    soak_node.serve("good")
    state_dir = "/opt/vllm-fleet/releases/good/soak/detached"
    soak = {"unit": UNIT, "base_url": soak_node.base_url, "venv": "/opt/vllm-fleet/releases/good", "model": MODEL,
            "state_dir": state_dir, **SHAPE, "duration_s": 10}
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_NOCOLOR": "1"}
    controller = subprocess.Popen(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(soak_node.inventory), PLAYBOOK,
         "-e", json.dumps({"soak": soak, "soak_poll_s": 2})],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_progress(soak_node, state_dir, 2)
    finally:
        os.killpg(controller.pid, 9)
        controller.wait(10)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and soak_node.read_json(f"{state_dir}/verdict.json") is None:
        time.sleep(0.5)
    verdict = soak_node.read_json(f"{state_dir}/verdict.json")
    assert verdict is not None, soak_node.progress(state_dir)[-3:]
    assert verdict["passed"] is True and verdict["duration_s"] >= 10, verdict["reasons"]


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
