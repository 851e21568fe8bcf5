"""vllm_watchdog on a simulated node serving the stand-in vLLM: the units and their
hardening, then the watchdog at work. It leaves a healthy instance alone under load and an
idle wedged one too; it restarts a wedged one under load within its window; with
max_restarts 1 (molecule.yml) it does not restart a second wedge within the hour; and, its
restart history reset, it restarts a wedged one whose clients time out and retry while the
server counts prompt tokens as requests arrive (prompt tokens and requests in flight keep
rising, generation is flat: arrivals are not progress).

The tests run in file order and share the node: each leaves the instance serving.
A wedge is the stand-in's SIGUSR1 (tests/fixtures/vllm_standin/README.md): /health stays
200, requests stay running, the token counters stay flat. A second SIGUSR1 resumes it."""
import json
import time
from pathlib import Path

import pytest

UNIT = "vllm@gpu0.service"
WATCHDOG = "vllm-fleet-watchdog@gpu0"
PORT = 18400
ROOT = "/opt/vllm-fleet"
CONFIG = "/etc/vllm-fleet/watchdog.json"
STATE = "/var/lib/vllm-fleet-watchdog/gpu0/state.json"
# molecule.yml
INTERVAL, WINDOW, GRACE, MAX_RESTARTS = 2, 6, 3, 1
# A slow CI machine: the timer's accuracy (1 s), a probe's HTTP timeouts, the stop of the
# wedged process and the start of the new one.
MARGIN = 12
REPO = Path(__file__).resolve().parents[3]
# Extra stand-in knobs for one test; /run: gone with the node, removed by the test anyway.
DROP_IN = f"/run/systemd/system/{UNIT}.d/vf-test-knobs.conf"


def show(host, unit, *props) -> dict:
    """systemctl show as a dict; a property on several lines (TimersMonotonic=) is joined."""
    out = host.check_output(f"systemctl show {unit} " + " ".join(f"--property={p}" for p in props))
    values = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        values[key] = f"{values[key]}\n{value}" if key in values else value
    return values


def main_pid(host) -> int:
    return int(show(host, UNIT, "MainPID")["MainPID"])


def node_time(host) -> float:
    return float(host.check_output("date +%s.%N"))


def events(host, since: float | None = None) -> list[dict]:
    """The watchdog's journal lines logged at or after `since` (node epoch; None: all), oldest first."""
    window = f" --since @{int(since) - 1}" if since else ""
    out = host.check_output(f"journalctl -t vllm-fleet-watchdog -o json --output-fields=MESSAGE --no-pager{window}")
    lines = []
    for raw in out.splitlines():
        entry = json.loads(raw)
        if since and int(entry["__REALTIME_TIMESTAMP"]) < since * 1e6:
            continue
        try:
            lines.append(json.loads(entry["MESSAGE"]))
        except (ValueError, TypeError):
            continue
    return lines


def journals(host) -> str:
    return host.run(f"journalctl --no-pager -n 60 -u {UNIT} -t vllm-fleet-watchdog -u {WATCHDOG}.service").stdout


def engine(host) -> dict:
    """running, waiting, generated and prompt tokens of the instance, read inside the node."""
    text = host.check_output(f"curl -sf --max-time 5 http://127.0.0.1:{PORT}/metrics")
    values = {"running": 0.0, "waiting": 0.0, "tokens": 0.0, "prompt": 0.0}
    for line in text.splitlines():
        for key, name in (("running", "vllm:num_requests_running"), ("waiting", "vllm:num_requests_waiting"),
                          ("tokens", "vllm:generation_tokens_total"), ("prompt", "vllm:prompt_tokens_total")):
            if line.startswith(name + "{") or line.startswith(name + " "):
                values[key] += float(line.rsplit(" ", 1)[1])
    return values


def in_flight(values: dict) -> float:
    return values["running"] + values["waiting"]


def wait_for(predicate, timeout: float, step: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(step)


def start_load(host, name: str, clients: int, max_tokens: int, client_timeout_s: float | None = None) -> None:
    """vf-load as a transient unit; with client_timeout_s its clients give up on a silent stream and retry."""
    timeout = f" {client_timeout_s:g}" if client_timeout_s else ""
    host.check_output(f"systemd-run --quiet --collect --unit={name} /usr/local/bin/vf-load {PORT} {clients} "
                      f"{max_tokens}{timeout}")


def stop_load(host, name: str) -> None:
    host.run(f"systemctl stop {name}")


def wedge(host) -> None:
    """SIGUSR1 to the stand-in (the second one resumes it)."""
    host.check_output(f"systemctl kill --kill-whom=main --signal=SIGUSR1 {UNIT}")


def busy_and_moving(host) -> bool:
    before = engine(host)
    time.sleep(0.5)
    after = engine(host)
    return in_flight(after) >= 1 and after["tokens"] > before["tokens"]


def serving_and_watched(host, since: float) -> int:
    """The instance is active, answers, and the watchdog has judged its process healthy
    (past the start-up grace): returns its MainPID, else 0."""
    state = show(host, UNIT, "ActiveState", "MainPID")
    pid = int(state["MainPID"])
    if state["ActiveState"] != "active" or not pid:
        return 0
    healthy = [e for e in events(host, since) if e["event"] == "healthy" and e.get("main_pid") == pid]
    return pid if healthy else 0


def restarted_as_wedged(host, pid: int, since: float, started: float, what: str) -> tuple[dict, dict]:
    """Wait for the watchdog to replace the wedged MainPID within its window, and for its two
    lines about it: returns the 'wedged' and 'restarted' events."""
    new_pid = wait_for(lambda: (main_pid(host) not in (0, pid)) and main_pid(host),
                       WINDOW + INTERVAL + MARGIN, step=0.25, what=f"a restart of {UNIT} (wedged)")
    print(f"{what} -> MainPID {pid} replaced by {new_pid} after {time.monotonic() - started:.1f} s "
          f"(window {WINDOW} s, interval {INTERVAL} s)")
    seen = wait_for(lambda: [e for e in events(host, since) if e["event"] in ("wedged", "restarted")], 10,
                    what="the watchdog's lines")
    assert [e["event"] for e in seen] == ["wedged", "restarted"], journals(host)
    wedged, restarted = seen
    assert wedged["main_pid"] == pid and wedged["flat_for_s"] >= WINDOW
    assert restarted["reason"] == "wedged" and restarted["main_pid"] == pid
    assert restarted["restarts_in_window"] == 1
    return wedged, restarted


def forget_restarts(host) -> None:
    """Start the watchdog afresh (what an operator does after a rate limit): with its timer
    stopped and no run under way, so no run writes the old history back, remove its state."""
    host.check_output(f"systemctl stop {WATCHDOG}.timer")
    wait_for(lambda: show(host, f"{WATCHDOG}.service", "ActiveState")["ActiveState"] in ("inactive", "failed"), 30,
             what="the watchdog's run under way finished")
    host.check_output(f"rm -f {STATE} && systemctl start {WATCHDOG}.timer")


def serve_with(host, knobs: dict) -> int:
    """Restart the instance with these extra stand-in knobs (a runtime drop-in; {}: none) and
    wait until it serves, watched: returns its MainPID."""
    if knobs:
        lines = " ".join(f"'Environment={k}={v}'" for k, v in knobs.items())
        host.check_output(f"mkdir -p {DROP_IN.rsplit('/', 1)[0]} && printf '%s\\n' '[Service]' {lines} > {DROP_IN}")
    else:
        host.check_output(f"rm -f {DROP_IN}")
    since = node_time(host)
    host.check_output(f"systemctl daemon-reload && systemctl restart {UNIT}")
    return wait_for(lambda: serving_and_watched(host, since), 60, what=f"{UNIT} serving, watched")


# --------------------------------------------------------------------------- installed

def test_timer_is_enabled_and_runs_the_watchdog(host):
    timer = host.service(f"{WATCHDOG}.timer")
    assert timer.is_enabled and timer.is_running, journals(host)
    props = show(host, f"{WATCHDOG}.timer", "TimersMonotonic", "AccuracyUSec")
    assert "OnActiveUSec=2s" in props["TimersMonotonic"] and "OnUnitActiveUSec=2s" in props["TimersMonotonic"]
    assert props["AccuracyUSec"] == "1s"
    # it has run, and every run so far exited 0
    service = show(host, f"{WATCHDOG}.service", "Type", "Result", "ExecMainStatus", "ExecMainStartTimestamp")
    assert service["Type"] == "oneshot" and service["ExecMainStartTimestamp"]
    assert (service["Result"], service["ExecMainStatus"]) == ("success", "0"), journals(host)


@pytest.mark.parametrize("prop, expected", [
    ("User", ""),  # root: systemctl restart needs it, with no capability at all
    ("NoNewPrivileges", "yes"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("PrivateUsers", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectProc", "invisible"),
    ("ProcSubset", "pid"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("SystemCallArchitectures", "native"),
    ("UMask", "0077"),
    ("ReadWritePaths", ""),
    ("StateDirectory", "vllm-fleet-watchdog/gpu0"),
    ("SyslogIdentifier", "vllm-fleet-watchdog"),
    ("LogLevelMax", "5"),  # notice: systemd's per-run "Starting/Finished" lines stay out
])
def test_hardening(host, prop, expected):
    assert show(host, f"{WATCHDOG}.service", prop)[prop] == expected


def test_only_unix_and_ip_sockets_and_only_to_loopback(host):
    props = show(host, f"{WATCHDOG}.service", "RestrictAddressFamilies", "IPAddressAllow", "IPAddressDeny")
    assert set(props["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert set(props["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}
    assert set(props["IPAddressAllow"].split()) == {"127.0.0.0/8", "::1/128"}


def test_exposure_is_low(host):
    out = host.check_output(f"systemd-analyze security --no-pager {WATCHDOG}.service")
    overall = [line for line in out.splitlines() if "Overall exposure level" in line][0]
    exposure = float(overall.split(":", 1)[1].split()[0])
    print(f"systemd-analyze security {WATCHDOG}.service: {exposure}")
    assert exposure <= 2.0, out


def test_one_source_of_the_logic_on_the_node(host):
    for name in ("watchdog.py", "vllm_progress.py"):
        installed = host.file(f"{ROOT}/libexec/vllm_fleet_watchdog/{name}")
        assert (installed.user, installed.mode) == ("root", 0o644)
        assert installed.content_string == (REPO / "plugins" / "module_utils" / name).read_text()
    program = host.file(f"{ROOT}/libexec/vllm-fleet-watchdog")
    assert (program.user, program.mode) == ("root", 0o755)


def test_settings(host):
    settings = json.loads(host.file(CONFIG).content_string)
    assert {k: settings[k] for k in ("interval_s", "window_s", "startup_grace_s", "max_restarts")} == {
        "interval_s": INTERVAL, "window_s": WINDOW, "startup_grace_s": GRACE, "max_restarts": MAX_RESTARTS}
    assert settings["instances"] == {"gpu0": {"unit": UNIT, "base_url": f"http://127.0.0.1:{PORT}"}}


# --------------------------------------------------------------------------- at work

def test_a_healthy_instance_under_load_is_left_alone(host):
    start_load(host, "vf-load-steady", clients=2, max_tokens=64)
    try:
        wait_for(lambda: busy_and_moving(host), 30, what="the steady load running")
        # What the watchdog sees right now, asked by hand (a fresh state, nothing written).
        dry = host.check_output(f"d=$(mktemp -d) && {ROOT}/libexec/vllm-fleet-watchdog --instance gpu0 "
                                f"--config {CONFIG} --dry-run --state-dir $d")
        seen = json.loads(dry.splitlines()[0][3:])
        assert seen["event"] == "healthy" and seen["running"] + seen["waiting"] >= 1 and seen["dry_run"]
        pid, since = main_pid(host), node_time(host)
        restarts = show(host, UNIT, "NRestarts")["NRestarts"]
        time.sleep(2 * WINDOW + INTERVAL)  # more than two windows of steady load
        assert busy_and_moving(host)
        assert main_pid(host) == pid and show(host, UNIT, "NRestarts")["NRestarts"] == restarts, journals(host)
        bad = [e for e in events(host, since) if e["event"] not in ("healthy",)]
        assert bad == [], journals(host)
        # the healthy line (logged when the verdict last changed) is about this process
        assert [e for e in events(host) if e["event"] == "healthy" and e["main_pid"] == pid]
    finally:
        stop_load(host, "vf-load-steady")


def test_an_idle_wedged_instance_is_left_alone(host):
    wait_for(lambda: in_flight(engine(host)) == 0, 30, what="the instance idle")
    pid, since = main_pid(host), node_time(host)
    wedge(host)
    try:
        time.sleep(WINDOW + INTERVAL + 2)  # longer than any wedge could take to be named
        assert main_pid(host) == pid, journals(host)
        assert [e for e in events(host, since) if e["event"] in ("wedged", "restarted", "stalled")] == []
    finally:
        wedge(host)  # resume


def test_a_wedged_instance_under_load_is_restarted_within_its_window(host):
    start_load(host, "vf-load-long", clients=1, max_tokens=100000)
    try:
        wait_for(lambda: busy_and_moving(host), 30, what="a long request in flight")
        pid, since = main_pid(host), node_time(host)
        started = time.monotonic()
        wedge(host)
        wedged, restarted = restarted_as_wedged(host, pid, since, started, "wedged")
        assert wedged["running"] >= 1 and restarted["max_restarts"] == MAX_RESTARTS
        assert json.loads(host.file(STATE).content_string)["restarts"][0]["reason"] == "wedged"
    finally:
        stop_load(host, "vf-load-long")
    wait_for(lambda: serving_and_watched(host, since), 60, what=f"{UNIT} serving again, watched")


def test_a_second_wedge_within_the_restart_window_is_rate_limited(host):
    start_load(host, "vf-load-long2", clients=1, max_tokens=100000)
    try:
        wait_for(lambda: busy_and_moving(host), 30, what="a long request in flight")
        pid, since = main_pid(host), node_time(host)
        wedge(host)
        limited = wait_for(lambda: [e for e in events(host, since) if e["event"] == "rate_limited"],
                           WINDOW + INTERVAL + MARGIN, what="a rate_limited line")
        time.sleep(INTERVAL + 1)  # and still nothing restarts it
        assert main_pid(host) == pid, journals(host)
        assert [e["event"] for e in events(host, since) if e["event"] != "stalled"] == ["wedged", "rate_limited"]
        assert limited[0]["reason"] == "wedged" and limited[0]["main_pid"] == pid
        assert (limited[0]["restarts_in_window"], limited[0]["max_restarts"]) == (1, MAX_RESTARTS)
        assert len(json.loads(host.file(STATE).content_string)["restarts"]) == 1
    finally:
        wedge(host)  # resume: the operators' job, here the test's
        stop_load(host, "vf-load-long2")


def test_retrying_clients_against_a_wedged_instance_do_not_hide_the_wedge(host):
    # The earlier wedges spent the restart budget (max_restarts 1 an hour): start afresh.
    forget_restarts(host)
    # A server whose prompt counter moves while the engine is wedged (counted on arrival).
    pid = serve_with(host, {"VLLM_STANDIN_PROMPT_TOKENS_ON_ARRIVAL": "1"})
    try:
        start_load(host, "vf-load-retry", clients=2, max_tokens=100000, client_timeout_s=2)
        try:
            wait_for(lambda: busy_and_moving(host), 30, what="the retrying clients' requests in flight")
            since = node_time(host)
            started = time.monotonic()
            wedge(host)
            time.sleep(0.3)  # a step under way when the signal came may still finish
            before = engine(host)
            # The signal that would fool a rule counting arrivals: the clients time out (2 s) and
            # send again, so prompt tokens and requests in flight rise while generation is flat.
            def retried():
                now = engine(host)
                rising = now["prompt"] > before["prompt"] and in_flight(now) > in_flight(before)
                return now if rising and main_pid(host) == pid else None

            during = wait_for(retried, WINDOW, what="the clients' retries against the wedged instance")
            assert main_pid(host) == pid and during["tokens"] == before["tokens"], (before, during)
            print(f"wedged, clients retrying: prompt tokens {before['prompt']:g} -> {during['prompt']:g}, in flight "
                  f"{in_flight(before):g} -> {in_flight(during):g}, generated tokens flat at {during['tokens']:g}")
            wedged, _ = restarted_as_wedged(host, pid, since, started, "wedged with retrying clients")
            # The watchdog saw the arrivals too, and judged them no progress.
            assert wedged["tokens"] == before["tokens"]
            assert wedged["prompt_tokens"] >= during["prompt"] > before["prompt"]
            assert wedged["running"] + wedged["waiting"] > wedged["in_flight_at_progress"], wedged
        finally:
            stop_load(host, "vf-load-retry")
    finally:
        serve_with(host, {})  # the instance as the role left it


def test_every_watchdog_run_succeeded(host):
    service = show(host, f"{WATCHDOG}.service", "Result")
    assert service["Result"] == "success"
    log = host.check_output(f"journalctl --no-pager -o cat -u {WATCHDOG}.service -t vllm-fleet-watchdog")
    assert "Traceback" not in log and "restart_failed" not in log and "state_reset" not in log, log[-3000:]
