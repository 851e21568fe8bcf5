"""The vllm_service role on a simulated two-GPU sm_120 node: the stand-in vLLM serving under
the real systemd units (one instance per GPU), engine death and restart, pre-staging, cutover
(gated by the catalogue), the stand-in's CUDA crash on the pre-fix release, rollback, an
instance that cannot start, and bad profiles refused before anything changes; the API key's one
way to vLLM, and nowhere else (command lines, units, the journal, the plays' output).

One node serves the whole module (setting it up costs a release install and a model "load";
every test leaves it serving release A). Tests that change what it serves put it back.
"""
from __future__ import annotations

import http.client
import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.simnode import simnode
from tests.integration.conftest import PREFIX
from tests.integration.playbook import Run, ansible_playbook

ROOT = "/opt/vllm-fleet"
UNIT = "vllm@gpu0.service"
UNIT1 = "vllm@gpu1.service"
PORT = 18100  # host network: apart from other tests' nodes and the Molecule scenario (18300)
PORT1 = 18101
KEY = "integration-test-key-7d41e0c2b9f3"
RETIRING = "integration-retiring-key-5e20a9d4c1"  # a rotation's window: still accepted beside KEY
RELEASE_A = {"vllm": "0.25.1", "torch": "2.11.0", "cudnn_package": "nvidia-cudnn-cu13", "cudnn": "9.24.0.43"}
RELEASE_B = {**RELEASE_A, "cudnn": "9.19.0.56"}  # the pre-fix release: the cuDNN blocker on sm_120
ID_A = "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"
ID_B = "vllm-0.25.1_nvidia-cudnn-cu13-9.19.0.56"
CUDNN_BLOCKER = "cudnn-sm12x-fusion-matmul-oob"
ACCEPT_B = [{"id": CUDNN_BLOCKER, "reason": "integration test: the stand-in's crash on the pre-fix release"}]
PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"
# The stable profile with the stand-in's knobs (tests only). With seed 6 and a mean of 40,
# the stand-in's cuDNN fault (sm_120, cuDNN < 9.23.1, CUDA graphs) fires at batch 64 on
# release B, every time: after readiness (~10 batches), within the first few loaded requests.
PROFILE = {
    "name": "qwen3.6-35b-a3b-nvfp4-sm120",
    "model": "/models/qwen3.6-35b-a3b-nvfp4",
    "serve_args": {
        "gpu-memory-utilization": 0.95, "max-model-len": 262144, "max-num-seqs": 128,
        "enable-chunked-prefill": True, "max-num-batched-tokens": 32768, "enable-prefix-caching": True,
        "kv-cache-dtype": "fp8", "tensor-parallel-size": 1, "enforce-eager": False,
    },
    "env": {
        "VLLM_USE_DEEP_GEMM_E8M0": "0",
        "VLLM_STANDIN_LOAD_SECONDS": "0.5",
        "VLLM_STANDIN_EXIT_DELAY_SECONDS": "0.2",
        "VLLM_STANDIN_SEED": "6",
        "VLLM_STANDIN_MEAN_STEPS_TO_CRASH": "40",
        "VLLM_LOG_STATS_INTERVAL": "60",
    },
}
VARS = {
    "vllm_fleet_release": RELEASE_A,
    "vllm_fleet_runtime_offline": True,
    "vllm_fleet_runtime_find_links": ["/srv/wheelhouse"],
    "vllm_fleet_instances": [{"name": "gpu0", "gpu": 0, "port": PORT}, {"name": "gpu1", "gpu": 1, "port": PORT1}],
    "vllm_fleet_service_api_key": KEY,
    "vllm_fleet_service_restart_sec": 1,
    "vllm_fleet_service_ready_timeout": 90,
    "vllm_fleet_service_ready_delay": 1,
    "vllm_fleet_profile": PROFILE,
}
KEY_FILE = "/etc/vllm-fleet/api-key.env"
# Where plays, units and instances write on the node: searched for the key (not the image's /usr).
WRITABLE = "/etc /opt /var /srv /tmp /root /run /home /usr/local"
PROCS = """import json, pathlib, sys
out = {}
for proc in pathlib.Path("/proc").glob("[0-9]*"):
    try:
        out[proc.name] = proc.joinpath(sys.argv[1]).read_bytes().decode(errors="replace").split("\\0")[:-1]
    except OSError:  # gone meanwhile, or not the user's
        pass
print(json.dumps(out))
"""
# What a bad profile run must leave untouched.
WATCHED = f"/etc/vllm-fleet /etc/systemd/system /etc/passwd /etc/group {ROOT}"


class Served:
    """The module's node, and the entry points of the role run against it."""

    def __init__(self, node: simnode.Node, inventory: Path):
        self.node, self.inventory = node, inventory
        # Every play run against the node, as (playbook:entry, run): the last test searches
        # all their output for the API key.
        self.runs: list[tuple[str, Run]] = []

    def play(self, playbook: str, entry: str = "main", flags: tuple[str, ...] = (), **extra):
        started = time.monotonic()
        run = ansible_playbook(str(PLAYBOOKS / playbook), self.inventory, "-e", f"entry={entry}", *flags,
                               extra_vars={**VARS, **extra}, timeout=400)
        run.seconds = time.monotonic() - started
        self.runs.append((f"{playbook}:{entry}", run))
        return run

    def sh(self, cmd: str) -> str:
        result = self.node.exec(cmd)
        assert result.returncode == 0, f"{cmd}: {result.stdout}{result.stderr}"
        return result.stdout.strip()

    def unit(self, unit: str = UNIT) -> dict:
        out = self.sh(f"systemctl show {unit} --property=MainPID,NRestarts,ExecMainStartTimestamp,ActiveState")
        return dict(line.split("=", 1) for line in out.splitlines())

    def units(self) -> dict:
        return {unit: self.unit(unit) for unit in (UNIT, UNIT1)}

    def link(self, name: str) -> str:
        return self.sh(f"readlink {ROOT}/{name}")

    def served_release(self, unit: str = UNIT) -> str:
        """The release the running process was started from (its interpreter's path)."""
        cmdline = self.sh(f"tr '\\0' ' ' < /proc/{self.unit(unit)['MainPID']}/cmdline")
        match = re.match(rf"{ROOT}/releases/([^/]+)/bin/python ", cmdline)
        assert match, cmdline
        return match.group(1)

    def loaded(self, unit: str = UNIT) -> str:
        """GPU and cuDNN as the newest start logged them (the stand-in logs what NVML and torch gave)."""
        lines = self.sh(f"journalctl --no-pager -o cat -u {unit} | grep 'as loaded by torch'").splitlines()
        return re.search(r"\(NVML index \d+\).*cuDNN \d+", lines[-1]).group(0)

    def loaded_cudnn(self, unit: str = UNIT) -> str:
        return re.search(r"cuDNN (\d+)", self.loaded(unit)).group(1)

    def procs(self, name: str, user: str = "root") -> dict[int, list[str]]:
        """/proc/<pid>/<name> (cmdline, environ) of every process on the node that user may read,
        split at its NULs."""
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"] if user != "root" else []
        result = self.node.exec([*as_user, "python3", "-", name], input=PROCS)
        assert result.returncode == 0, result.stderr
        return {int(pid): items for pid, items in json.loads(result.stdout).items()}

    def journal(self, lines: int = 80, unit: str = UNIT) -> str:
        return self.node.exec(f"journalctl --no-pager -n {lines} -u {unit}").stdout

    def wait_active(self, timeout: float = 60, **expect) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.unit()
            if state["ActiveState"] == "active" and all(state[k] == v for k, v in expect.items()) \
                    and _job_idle(self):
                return state
            time.sleep(0.5)
        raise AssertionError(f"{UNIT} not active with {expect} after {timeout} s: {self.unit()}\n{self.journal()}")


def _job_idle(served: Served) -> bool:
    return served.sh(f"systemctl show -P Job {UNIT}") == ""


def http(path: str, body: dict | None = None, key: str | None = KEY, timeout: float = 30,
         port: int = PORT) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else {}
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def completes(port: int = PORT) -> bool:
    status, reply = http("/v1/completions", {"prompt": "one node at a time", "max_tokens": 4}, port=port)
    return status == 200 and bool(reply["choices"][0]["text"].strip())


def two_gpu_profile(directory: Path) -> Path:
    """The fake NVML profile of a node with two RTX PRO 6000 (sm_120)."""
    from tests.fixtures.nvml.build import PROFILES_DIR

    one = (PROFILES_DIR / "rtx_pro_6000.conf").read_text().replace("device_count=1", "device_count=2")
    second = [line.replace("0.", "1.", 1) for line in one.splitlines() if line.startswith("0.")]
    second = [line.replace("GPU-7c3e9a52", "GPU-8d4f0b63").replace("00000000:01:00.0", "00000000:02:00.0")
              for line in second]
    path = directory / "rtx_pro_6000_x2.conf"
    path.write_text(one + "\n".join(second) + "\n")
    return path


@pytest.fixture(scope="module")
def node_wheelhouse(tmp_path_factory) -> Path:
    from tests.fixtures.wheels.build import build_node_wheelhouse

    return build_node_wheelhouse(tmp_path_factory.mktemp("service-wheelhouse"))


@pytest.fixture(scope="module")
def served(node_image, fake_nvml_lib, node_wheelhouse, tmp_path_factory):
    """A two-GPU sm_120 node serving release A with the stable profile (instances gpu0 and
    gpu1), A marked known-good."""
    prefix = f"{PREFIX}svc-"
    node = simnode.start_node("svc", nvml_lib=fake_nvml_lib, image=node_image, prefix=prefix,
                              nvml_profile=two_gpu_profile(tmp_path_factory.mktemp("nvml-x2")))
    try:
        subprocess.run(["podman", "cp", f"{node_wheelhouse}/.", f"{node.container}:/srv/wheelhouse"], check=True,
                       capture_output=True, timeout=120)
        inventory = simnode.write_inventory([node], tmp_path_factory.mktemp("service") / "inventory.yml")
        served = Served(node, inventory)
        timings = {}
        for playbook, entry in (("stage.yml", "main"), ("service.yml", "cutover"), ("service.yml", "main"),
                                ("service.yml", "mark_known_good")):
            run = served.play(playbook, entry)
            timings[f"{playbook}:{entry}"] = round(run.seconds, 1)
            assert run.rc == 0, f"{playbook} {entry}:\n{run.output[-5000:]}\n{served.journal()}"
        print(f"\nservice node set up: {timings}")
        yield served
    finally:
        simnode.remove_nodes(prefix)


@pytest.fixture(scope="module")
def prestaged(served):
    """Release B installed next to A on the serving node, with the unit observed around it."""
    before = {**served.units(), "current": served.link("current")}
    run = served.play("stage.yml", vllm_fleet_release=RELEASE_B)
    assert run.rc == 0, run.output[-5000:]
    after = {**served.units(), "current": served.link("current")}
    return before, after


# --- measured -------------------------------------------------------------------------------

def test_systemd_analyze_security_exposure(served, record_property):
    out = served.sh(f"systemd-analyze security --no-pager {UNIT}")
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
    still_open = [line.split()[1] for line in out.splitlines() if line.startswith("✗")]
    record_property("exposure", exposure)
    print(f"\nsystemd-analyze security {UNIT}: exposure {exposure}; open: {', '.join(still_open)}")
    assert 0 < exposure <= 2.0, out  # gated (issue 14); measured 1.6 on systemd 252


# --- the API key ------------------------------------------------------------------------------
# Its one way to vLLM: a root-only file that systemd reads before dropping privileges, then the
# instance's environment (VLLM_API_KEY). Never a command line, a unit, a log line or play output.

def with_key(text: str) -> list[str]:
    """The lines of text that hold the API key."""
    return [line for line in text.splitlines() if KEY in line]


def test_the_api_key_reaches_vllm_only_through_its_root_only_file(served):
    # root:root 0600, in a directory the service group may only enter: the vllm user cannot read it.
    assert served.sh(f"stat -c '%U:%G %a' /etc/vllm-fleet {KEY_FILE}").splitlines() == \
        ["root:vllm 750", "root:root 600"]
    denied = served.node.exec(f"setpriv --reuid=vllm --regid=vllm --init-groups cat {KEY_FILE}")
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    assert with_key(served.sh(f"cat {KEY_FILE}")) == [f'VLLM_API_KEY="{KEY}"']
    # The only files that hold it (the pattern goes to grep on stdin, not on its command line):
    # the file and its copy kept with the known-good release, which rollback puts back.
    kept = "/etc/vllm-fleet/known-good/api-key.env"
    found = served.node.exec(f"grep -rlsF -D skip -f - {WRITABLE}", input=f"{KEY}\n")
    assert sorted(found.stdout.split()) == sorted([KEY_FILE, kept]), found
    assert served.sh(f"stat -c '%U:%G %a' {kept}") == "root:root 600"
    denied = served.node.exec(f"setpriv --reuid=vllm --regid=vllm --init-groups cat {kept}")
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied

    # In each instance's environment, as systemd handed it over (the container's root lacks
    # CAP_SYS_PTRACE: the vllm user reads its own); on no process's command line.
    cmdlines, environs = served.procs("cmdline"), served.procs("environ", user="vllm")
    for unit in (UNIT, UNIT1):
        pid = int(served.unit(unit)["MainPID"])
        assert "--config" in cmdlines[pid] and f"VLLM_API_KEY={KEY}" in environs[pid], cmdlines[pid]
    assert [args for args in cmdlines.values() if KEY in " ".join(args)] == []

    # The unit names the file, not the key; `systemctl show` lists Environment= values (a key
    # set there would show) but not the contents of an EnvironmentFile=.
    for unit in (UNIT, UNIT1):
        shown = served.sh(f"systemctl show {unit}")
        assert f"EnvironmentFiles={KEY_FILE} (ignore_errors=no)" in shown.splitlines(), shown
        assert re.search(r"^Environment=.*\bHOME=", shown, re.MULTILINE), shown
        assert with_key(shown) == [] and with_key(served.sh(f"systemctl cat {unit}")) == []


def test_a_verbose_rerun_shows_no_key_and_changes_nothing(served):
    """At -vvv Ansible prints each task's module arguments and result unless no_log hides them:
    the tasks that handle the key (its file, the authenticated readiness requests) must."""
    run = served.play("service.yml", flags=("-vvv",))
    assert run.rc == 0 and re.search(r"svc\s+:.*changed=0", run.output), run.output[-3000:]
    # Verbose indeed: module arguments and rendered files (gpu0.env) are in the output ...
    assert "module_args:" in run.output and 'CUDA_VISIBLE_DEVICES="0"' in run.output
    # ... and the key's tasks ran, censored: its file's task, and readiness's key option (no_log
    # in vllm_ready's argument spec, masked in the module's arguments).
    assert "hidden due to the fact that" in run.output
    assert re.search(r"api_keys:\n\s*- VALUE_SPECIFIED_IN_NO_LOG_PARAMETER\n", run.output), run.output[-3000:]
    assert with_key(run.output) == []


# --- the service ------------------------------------------------------------------------------

def test_the_node_serves_release_a_with_the_key_required(served):
    assert served.link("current") == f"releases/{ID_A}"
    assert served.link("known-good") == f"releases/{ID_A}"
    assert served.served_release() == ID_A
    assert completes(), served.journal()
    assert http("/v1/models", key=None)[0] == 401
    assert http("/v1/models", key="wrong-key-0000000000")[0] == 401


def test_each_instance_is_pinned_to_its_gpu_and_port(served):
    for unit, index, port in ((UNIT, 0, PORT), (UNIT1, 1, PORT1)):
        assert served.unit(unit)["ActiveState"] == "active"
        assert served.served_release(unit) == ID_A
        assert served.loaded(unit).startswith(f"(NVML index {index})"), served.loaded(unit)
        assert completes(port), served.journal(unit=unit)
    env = served.sh("cat /etc/vllm-fleet/gpu1.env")
    assert 'CUDA_VISIBLE_DEVICES="1"' in env.splitlines()
    # The health wait reads the instance config: no name of ours that vLLM would log as unknown.
    assert "VLLM_FLEET" not in env and "VLLM_FLEET" not in served.journal(400, unit=UNIT1)
    assert served.sh("ls /var/lib/vllm-fleet /var/cache/vllm-fleet").split() == \
        ["/var/cache/vllm-fleet:", "gpu0", "gpu1", "/var/lib/vllm-fleet:", "gpu0", "gpu1"]


def test_killing_the_engine_brings_the_service_back_and_nrestarts_counts_it(served):
    before = served.wait_active()
    other = served.unit(UNIT1)
    # SIGTERM: vLLM shuts down cleanly and exits 0 -- what 0.25.1 does when its engine dies.
    served.sh(f"kill -TERM {before['MainPID']}")
    after = served.wait_active(NRestarts=str(int(before["NRestarts"]) + 1))

    assert after["MainPID"] != before["MainPID"]
    assert served.unit(UNIT1) == other  # the other GPU's instance never noticed
    journal = served.journal(40)
    assert "Deactivated successfully" in journal  # a clean exit, status 0: on-failure would stop here
    assert f"restart counter is at {after['NRestarts']}" in journal
    assert completes(), served.journal()


# --- a stop drains the requests in flight -------------------------------------------------------

LONG_TOKENS = 400  # about 8 s at the stand-in's 0.02 s a step: still running when the stop comes


def _long_completion(result: dict) -> None:
    try:
        result["reply"] = http("/v1/completions", {"prompt": "drain me", "max_tokens": LONG_TOKENS, "ignore_eos": True},
                               port=PORT1, timeout=120)
    except (OSError, http.client.HTTPException) as exc:  # the connection cut
        result["error"] = repr(exc)


def _running(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running{"))


def stop_during_a_long_request(served: Served) -> dict:
    """A long completion to gpu1, `systemctl stop` while it runs, the unit started again: what
    the client got ({reply: (status, body)} or {error}) and how long the stop took."""
    result: dict = {}
    client = threading.Thread(target=_long_completion, args=(result,))
    client.start()
    deadline = time.monotonic() + 20
    while _running(PORT1) < 1:
        assert time.monotonic() < deadline and client.is_alive(), f"the request never ran: {result}"
        time.sleep(0.2)
    started = time.monotonic()
    served.sh(f"systemctl stop {UNIT1}")
    result["stop_seconds"] = round(time.monotonic() - started, 1)
    client.join(150)
    served.sh(f"systemctl start {UNIT1}")
    return result


def test_a_stop_drains_the_request_in_flight_and_shutdown_timeout_0_cuts_it(served):
    """vLLM 0.25.1's --shutdown-timeout (vllm/v1/engine/core.py): on SIGTERM, N stops taking
    requests and drains those in flight for up to N s; 0 aborts them. The role sets 30 and
    TimeoutStopSec (90 s) above it. The control: the same stop with 0 cuts the request."""
    assert "shutdown-timeout: 30" in served.sh("cat /etc/vllm-fleet/gpu1.yaml").splitlines()
    assert served.sh(f"systemctl show -P TimeoutStopUSec {UNIT1}") == "1min 30s"
    drained = stop_during_a_long_request(served)
    print(f"\nstop with shutdown-timeout 30: {drained.get('error') or drained['reply'][1].get('usage')}, "
          f"stop took {drained['stop_seconds']} s")
    assert "reply" in drained and drained["reply"][0] == 200, drained
    assert drained["reply"][1]["usage"]["completion_tokens"] == LONG_TOKENS, drained
    assert completes(PORT1), served.journal(unit=UNIT1)

    try:
        run = served.play("service.yml", vllm_fleet_service_shutdown_timeout=0)
        assert run.rc == 0, run.output[-5000:]
        assert "shutdown-timeout: 0" in served.sh("cat /etc/vllm-fleet/gpu1.yaml").splitlines()
        cut = stop_during_a_long_request(served)
        print(f"stop with shutdown-timeout 0: {cut.get('error') or cut['reply']}, stop took {cut['stop_seconds']} s")
        whole = "reply" in cut and cut["reply"][0] == 200 \
            and cut["reply"][1].get("usage", {}).get("completion_tokens") == LONG_TOKENS
        assert not whole, cut
    finally:
        restored = served.play("service.yml")
    assert restored.rc == 0, restored.output[-5000:]
    assert completes() and completes(PORT1)


def test_a_rotation_window_puts_the_keys_in_the_config_and_none_in_the_journal(served):
    """In a rotation's window the keys are vLLM arguments (api-key in the instance config), and
    0.25.1 logs every non-default argument at start: the role's logging configuration
    (logging.json) drops that line and keeps the others. (tests/integration/test_rotation.py does
    the same across a rollout; tests/unit/test_serve_config.py has the negative control.)"""
    since = served.sh("date +%s")
    # The tests before this one restarted the instances often: re-arm systemd's start limit
    # (StartLimitBurst), or this restart ends in start-limit-hit, not in the window.
    served.sh("systemctl reset-failed 'vllm@*'")
    try:
        run = served.play("service.yml", vllm_fleet_service_api_key_retiring=[RETIRING])
        assert run.rc == 0, run.output[-5000:]
        assert f'api-key: ["{KEY}", "{RETIRING}"]' in served.sh("cat /etc/vllm-fleet/gpu0.yaml").splitlines()
        assert http("/v1/models")[0] == http("/v1/models", key=RETIRING)[0] == 200
        journal = served.sh(f"journalctl --no-pager -o cat -u {UNIT} --since @{since}")
        assert "vLLM server version 0.25.1" in journal  # the instance restarted and logged its start ...
        assert "non-default args" not in journal  # ... without its arguments
        fields = served.sh("journalctl --no-pager -o verbose --all")
        assert [key for key in (KEY, RETIRING) if key in fields] == []
    finally:
        restored = served.play("service.yml")
    assert restored.rc == 0, restored.output[-5000:]
    assert http("/v1/models", key=RETIRING)[0] == 401


def test_prestaging_another_release_does_not_restart_or_move_current(served, prestaged):
    before, after = prestaged
    assert after == before
    assert served.link("current") == f"releases/{ID_A}"
    assert served.node.exec(f"test -f {ROOT}/releases/{ID_B}/vllm-fleet-release.json").returncode == 0
    assert served.served_release() == ID_A


def test_cutover_to_a_blocked_release_fails_before_anything_changes(served, prestaged):
    before = served.units()
    run = served.play("service.yml", "cutover", vllm_fleet_switch_release_id=ID_B)

    assert run.rc != 0
    assert f"[{CUDNN_BLOCKER}]" in run.output and "preflight blocked the rollout" in run.output
    assert served.link("current") == f"releases/{ID_A}"
    assert served.units() == before


def test_cutover_then_rollback_returns_the_node_to_the_exact_previous_release(served, prestaged):
    served.wait_active()

    def state():
        return {"current": served.link("current"), "known-good": served.link("known-good"),
                "release": [served.served_release(u) for u in (UNIT, UNIT1)],
                "loaded": [served.loaded(u) for u in (UNIT, UNIT1)], "version": http("/version")[1]}

    a = state()
    assert served.loaded_cudnn() == "92400" and a["release"] == [ID_A, ID_A]

    # Cut over to B (its blocker accepted on purpose): current flips, the instance restarts on B.
    run = served.play("service.yml", "cutover", vllm_fleet_switch_release_id=ID_B,
                      vllm_fleet_accepted_risks=ACCEPT_B)
    assert run.rc == 0, run.output[-5000:]
    assert re.search(rf"previous: {ID_A}\s+release: {ID_B}", run.output)
    assert served.link("current") == f"releases/{ID_B}"
    assert [served.served_release(u) for u in (UNIT, UNIT1)] == [ID_B, ID_B]
    assert [served.loaded_cudnn(u) for u in (UNIT, UNIT1)] == ["91900", "91900"]
    on_b = served.wait_active()

    # B is the release that crashed in production: under load the stand-in's CUDA fault kills
    # the engine, the server exits 0, and systemd brings it back (still on B).
    for _ in range(20):
        status, _ = http("/v1/completions", {"prompt": "load", "max_tokens": 16, "ignore_eos": True})
        if status != 200:
            break
    assert status == 500, "the stand-in's cuDNN fault did not fire on release B"
    restarted = served.wait_active(NRestarts=str(int(on_b["NRestarts"]) + 1))
    assert restarted["MainPID"] != on_b["MainPID"]
    journal = served.journal(200)
    assert "CUDA error: an illegal memory access" in journal or "CUDA error: misaligned address" in journal
    assert "EngineDeadError" in journal
    assert served.served_release() == ID_B and completes()

    # Roll back to known-good: A again, exactly.
    run = served.play("service.yml", "rollback")
    assert run.rc == 0, run.output[-5000:]
    assert re.search(rf"previous: {ID_B}\s+release: {ID_A}", run.output)
    assert state() == a
    assert completes() and completes(PORT1)


def test_rollback_without_a_known_good_release_fails_clearly(served):
    before = served.units()
    served.sh(f"mv {ROOT}/known-good {ROOT}/known-good.aside")
    try:
        run = served.play("service.yml", "rollback")
    finally:
        served.sh(f"mv {ROOT}/known-good.aside {ROOT}/known-good")
    assert run.rc != 0
    assert "no known-good release to roll back to" in run.output
    assert served.link("current") == f"releases/{ID_A}"
    assert served.units() == before


def test_an_instance_that_cannot_start_fails_readiness_with_its_journal(served):
    """vLLM fails at start (nvfp4 KV cache on sm_120: a ValueError at start-up in 0.25.1, its
    catalogue blocker accepted on purpose): the instances crash-loop until the start limit, and
    readiness stops with their journal. Applying a good profile again re-arms the start limit
    and serves."""
    unstartable = {**PROFILE, "serve_args": {**PROFILE["serve_args"], "kv-cache-dtype": "nvfp4"}}
    accept = [{"id": "nvfp4-kv-cache-sm12x", "reason": "integration test: an instance that cannot start"}]
    try:
        run = served.play("service.yml", vllm_fleet_profile=unstartable, vllm_fleet_accepted_risks=accept)
        assert run.rc != 0
        assert "vLLM instances not ready (limit 90 s)" in run.output
        assert "ActiveState=failed" in run.output  # the start limit, not the full timeout
        assert "ValueError" in run.output and "nvfp4" in run.output  # the journal, in the message
    finally:
        restored = served.play("service.yml")
    assert restored.rc == 0, restored.output[-5000:]
    assert completes() and completes(PORT1)


def test_a_profile_change_restarts_once_and_an_unlisted_instance_is_removed(served):
    """The profile changes and gpu1 leaves the list: gpu0 restarts once on the new config,
    gpu1 is stopped, disabled and its files removed. (It stays so: the tests after this one
    only check that nothing changes.)"""
    before = served.wait_active()
    since = served.sh("date +%s")
    changed = {**PROFILE, "serve_args": {**PROFILE["serve_args"], "max-num-seqs": 64}}
    only_gpu0 = VARS["vllm_fleet_instances"][:1]
    run = served.play("service.yml", vllm_fleet_profile=changed, vllm_fleet_instances=only_gpu0)
    assert run.rc == 0, run.output[-5000:]
    after = served.wait_active()
    assert after["MainPID"] != before["MainPID"]
    assert "max-num-seqs: 64" in served.sh("cat /etc/vllm-fleet/gpu0.yaml").splitlines()
    # one model load, not a restart per changed file
    assert served.sh(f"journalctl --no-pager -o cat -u {UNIT} --since @{since} | grep -c '^Started vllm@'") == "1"
    assert completes()
    assert served.node.exec(f"systemctl is-active {UNIT1}").stdout.strip() == "inactive"
    assert served.node.exec(f"systemctl is-enabled {UNIT1}").stdout.strip() == "disabled"
    # gpu1's files are gone; known-good/ is the configuration kept with the known-good release
    assert served.sh("ls /etc/vllm-fleet").split() == ["api-key.env", "gpu0.env", "gpu0.yaml", "known-good",
                                                       "logging.json", "profile.json"]
    # ... and applying it again changes nothing.
    again = served.play("service.yml", vllm_fleet_profile=changed, vllm_fleet_instances=only_gpu0)
    assert again.rc == 0 and re.search(r"svc\s+:.*changed=0", again.output), again.output[-3000:]
    assert served.unit()["MainPID"] == after["MainPID"]


@pytest.mark.parametrize("case, serve_args, expected", [
    ("unknown flag and out of range",
     {"enable-prefix-cache": True, "gpu-memory-utilization": 1.5},
     ["unknown flag --enable-prefix-cache for vllm serve 0.25.1 (did you mean --enable-prefix-caching?)",
      "--gpu-memory-utilization 1.5 is out of range: it must be > 0 and <= 1"]),
    ("nvfp4 KV cache on sm_120",
     {"kv-cache-dtype": "nvfp4"},
     ["preflight blocked the rollout", "[nvfp4-kv-cache-sm12x]", "compute capability 12.0 (devices 0, 1)"]),
])
def test_a_bad_profile_fails_before_any_file_changes(served, case, serve_args, expected):
    served.wait_active()
    before = served.units()
    served.sh("touch /tmp/before-bad-profile && sleep 1")
    bad = {**PROFILE, "serve_args": {**PROFILE["serve_args"], **serve_args}}
    run = served.play("service.yml", vllm_fleet_profile=bad)

    assert run.rc != 0
    for text in expected:
        assert text in run.output, run.output[-4000:]
    assert "Traceback" not in run.output
    assert served.sh(f"find {WATCHED} -newer /tmp/before-bad-profile") == ""
    assert served.units() == before


# --- last: what every test above logged and printed -------------------------------------------

def test_the_api_key_is_in_no_journal_entry_and_no_play_output(served):
    journal = served.sh("journalctl --no-pager -o cat")
    # Every field of every entry (_CMDLINE=, systemd's messages about units), blobs in full.
    fields = served.sh("journalctl --no-pager -o verbose --all")
    assert "_CMDLINE=" in fields and "Started vllm@gpu0.service" in journal
    assert with_key(journal) == [] and with_key(fields) == [] and RETIRING not in fields

    assert {"stage.yml:main", "service.yml:cutover", "service.yml:main", "service.yml:mark_known_good"} <= \
        {label for label, _ in served.runs}
    assert {label: with_key(run.output) for label, run in served.runs if KEY in run.output} == {}
