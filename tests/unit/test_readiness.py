"""module_utils/readiness.py (the vllm_ready module's logic) without Ansible: real HTTP servers
on loopback stand in for the instances, a fake command runner for systemctl and journalctl."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import readiness
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.readiness import NotReady, units_state, wait_ready

MODEL = "/models/qwen3.6-35b-a3b-nvfp4"
KEY, OLD = "new-key-0123456789abcdef", "old-key-0123456789abcdef"


class Instance:
    """One vLLM-like server: what it answers can change while the wait runs."""

    def __init__(self):
        self.health = 200
        self.models = [MODEL]
        self.text = " one node at a time"
        self.keys: set[str] = set()  # empty: no key required
        self.seen: list[tuple[str, str, str | None, dict | None]] = []  # method, path, key, body
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def _handler(self):
        instance = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _allowed(self):
                auth = self.headers.get("Authorization", "")
                key = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
                return key, not instance.keys or key in instance.keys

            def do_GET(self):
                key, allowed = self._allowed()
                instance.seen.append(("GET", self.path, key, None))
                if self.path == "/health":
                    self._send(instance.health, {})
                elif self.path == "/v1/models":
                    if not allowed:
                        self._send(401, {"error": "Unauthorized"})
                    else:
                        self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in instance.models]})
                else:
                    self._send(404, {})

            def do_POST(self):
                key, allowed = self._allowed()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                instance.seen.append(("POST", self.path, key, body))
                if not allowed:
                    self._send(401, {"error": "Unauthorized"})
                    return
                self._send(200, {"model": body["model"], "choices": [{"index": 0, "text": instance.text}],
                                 "usage": {"prompt_tokens": 9, "completion_tokens": 3 if instance.text else 0}})

        return Handler

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gpus():
    made = [Instance(), Instance()]
    yield made
    for instance in made:
        instance.close()


class Systemd:
    """Fake systemctl and journalctl: each unit's states in turn (the last one repeats)."""

    def __init__(self, *states: str):
        self.states = list(states)
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout):
        self.calls.append(argv)
        if argv[0] == "journalctl":
            unit = argv[argv.index("--unit") + 1]
            return 0, f"2026-12-06T10:00:00+0000 node vllm[7]: {unit}: unrecognized arguments: --moe-backend\n", ""
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        active, job = state.split("/") if "/" in state else (state, "")
        out = "".join(f"Id={unit}\nActiveState={active}\nSubState=x\nJob={job}\nNRestarts=0\n\n" for unit in argv[3:])
        return 0, out, ""


def wait(gpus, systemd=None, keys=(), timeout=5.0, delay=0.02, **more):
    instances = [{"name": f"gpu{index}", "port": gpu.port} for index, gpu in enumerate(gpus)]
    return wait_ready(instances, [f"vllm@{item['name']}" for item in instances], "127.0.0.1", list(keys),
                      timeout, delay, 2.0, "The fleet rolls out", 8, run=systemd or Systemd("active"), **more)


def test_every_instance_serves_and_says_what_it_answered(gpus):
    systemd = Systemd("activating/12", "activating/12", "active")
    result = wait(gpus, systemd)

    assert result["instances"] == [{"name": "gpu0", "port": gpus[0].port, "model": MODEL, "completion_tokens": 3},
                                   {"name": "gpu1", "port": gpus[1].port, "model": MODEL, "completion_tokens": 3}]
    assert result["key_index"] is None
    assert "ActiveState=active" in result["systemd"] and "" not in result["systemd"]
    show = [call for call in systemd.calls if call[0] == "systemctl"]
    assert len(show) == 3  # polled until active with no job, then not again
    assert show[0] == ["systemctl", "show", "--property=Id,ActiveState,SubState,Job,NRestarts",
                       "vllm@gpu0.service", "vllm@gpu1.service"]
    assert not [call for call in systemd.calls if call[0] == "journalctl"]  # no journal when ready
    for gpu in gpus:
        assert [(method, path) for method, path, _, _ in gpu.seen] == \
            [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")]
        body = gpu.seen[-1][3]
        assert body == {"model": MODEL, "prompt": "The fleet rolls out", "max_tokens": 8, "temperature": 0}
        assert all(key is None for _, _, key, _ in gpu.seen)  # no key: no Authorization header


def test_an_active_unit_with_a_job_pending_is_not_ready_yet(gpus):
    """A restart queued behind the old process: active, but a job runs; not done."""
    systemd = Systemd("active/345", "active")
    wait(gpus, systemd)
    assert len([call for call in systemd.calls if call[0] == "systemctl"]) == 2


def test_a_failed_unit_stops_the_wait_at_once_with_its_journal(gpus):
    systemd = Systemd("activating/12", "failed")
    started = time.monotonic()
    with pytest.raises(NotReady) as caught:
        wait(gpus, systemd, timeout=60)

    assert time.monotonic() - started < 5  # the start limit, not the full 60 s
    message = caught.value.message
    assert message.startswith('vLLM instances not ready (limit 60 s), at "Fail when an instance gave up starting":\n')
    assert readiness.START_LIMIT in message
    assert "systemd: Id=vllm@gpu0.service, ActiveState=failed, SubState=x, Job=, NRestarts=0, Id=vllm@gpu1" in message
    for name in ("gpu0", "gpu1"):
        assert f"--- journalctl -u vllm@{name} (last 40 lines) ---\n" in message
        assert f"vllm@{name}.service: unrecognized arguments: --moe-backend" in message
    assert ["journalctl", "--no-pager", "--output=short-iso", "--lines=40", "--unit", "vllm@gpu0.service"] \
        in systemd.calls
    assert gpus[0].seen == []  # never probed over HTTP
    assert caught.value.stage == readiness.STAGE_FAILED


def test_health_200_with_empty_completions_is_not_ready(gpus):
    """/health is green before a model serves: an empty completion is not readiness."""
    gpus[1].text = ""
    started = time.monotonic()
    with pytest.raises(NotReady) as caught:
        wait(gpus, timeout=0.5)

    assert 0.5 <= time.monotonic() - started < 3
    message = caught.value.message
    assert message.startswith(f'vLLM instances not ready (limit 0.5 s), at "{readiness.STAGE_COMPLETION}":\n'
                              f"last answer of gpu1 (port {gpus[1].port}): HTTP 200 ")
    assert '"text": ""' in message
    posts = [seen for seen in gpus[1].seen if seen[0] == "POST"]
    assert len(posts) > 2  # retried until the deadline


def test_models_listing_nothing_yet_is_waited_for(gpus):
    gpus[0].models = []
    threading.Timer(0.3, lambda: setattr(gpus[0], "models", [MODEL])).start()
    result = wait(gpus)
    assert result["instances"][0]["model"] == MODEL
    assert len([seen for seen in gpus[0].seen if seen[1] == "/v1/models"]) > 2


def test_in_a_rotation_window_the_key_the_instances_take_is_found_and_used(gpus):
    """A node rolled back inside the window takes only the old key (the second in the list)."""
    for gpu in gpus:
        gpu.keys = {OLD}
    result = wait(gpus, keys=[KEY, OLD])

    assert result["key_index"] == 1
    probes = [seen[2] for seen in gpus[0].seen if seen[1] == "/v1/models"]
    assert probes[:2] == [KEY, OLD]
    for gpu in gpus:
        authed = [seen for seen in gpu.seen if seen[1] != "/health"]
        assert authed[-2:][0][2] == OLD and authed[-1][2] == OLD  # models and completion with OLD
    assert [item["model"] for item in result["instances"]] == [MODEL, MODEL]


def test_one_key_is_sent_without_probing(gpus):
    for gpu in gpus:
        gpu.keys = {KEY}
    result = wait(gpus, keys=[KEY])
    assert result["key_index"] == 0
    assert [seen[2] for seen in gpus[0].seen] == [None, KEY, KEY]  # /health needs no key


def test_a_refused_key_fails_at_the_deadline_without_showing_a_key(gpus):
    for gpu in gpus:
        gpu.keys = {"the-one-key-it-takes-000"}
    with pytest.raises(NotReady) as caught:
        wait(gpus, keys=[KEY, OLD], timeout=0.3)
    message = caught.value.message
    assert f'at "{readiness.STAGE_MODELS}":\nlast answer of gpu0 (port {gpus[0].port}): HTTP 401' in message
    assert KEY not in message and OLD not in message


def test_timeout_says_the_stage_the_last_answer_systemd_and_each_journal(gpus):
    gpus[0].health = 503
    started = time.monotonic()
    with pytest.raises(NotReady) as caught:
        wait(gpus, timeout=0.4, delay=0.1)

    assert 0.4 <= time.monotonic() - started < 3
    lines = caught.value.message.splitlines()
    assert lines[0] == f'vLLM instances not ready (limit 0.4 s), at "{readiness.STAGE_HEALTH}":'
    assert lines[1] == f"last answer of gpu0 (port {gpus[0].port}): HTTP 503 {{}}"
    assert lines[2].startswith("systemd: Id=vllm@gpu0.service, ActiveState=active,")
    assert lines[3] == "--- journalctl -u vllm@gpu0 (last 40 lines) ---"
    assert lines[5] == "--- journalctl -u vllm@gpu1 (last 40 lines) ---"
    assert 3 <= len([seen for seen in gpus[0].seen if seen[1] == "/health"]) <= 6  # every delay, not busy
    assert gpus[1].seen == []  # gpu0 first: gpu1 never reached


def test_an_instance_nobody_listens_on_is_no_answer(gpus):
    port = gpus[1].port
    gpus[1].close()
    with pytest.raises(NotReady) as caught:
        wait(gpus, timeout=0.2)
    assert f"last answer of gpu1 (port {port}): no answer: " in caught.value.message
    assert "refused" in caught.value.message.lower()


def test_systemctl_that_fails_is_retried_then_reported(gpus):
    def broken(argv, timeout):
        return (1, "", "Failed to connect to bus") if argv[0] == "systemctl" else (1, "", "no journal")

    with pytest.raises(NotReady) as caught:
        wait(gpus, broken, timeout=0.1)
    message = caught.value.message
    assert f'at "{readiness.STAGE_SYSTEMD}":\nsystemctl show exited 1: Failed to connect to bus\nsystemd: \n' in message
    assert "(journalctl exited 1: no journal)" in message


@pytest.mark.parametrize("lines, state", [
    (["ActiveState=active", "Job=", "ActiveState=active", "Job="], "ready"),
    (["ActiveState=active", "Job=", "ActiveState=activating", "Job=9"], "starting"),
    (["ActiveState=active", "Job=", "ActiveState=failed", "Job="], "failed"),
    (["ActiveState=active", "Job="], "starting"),  # one unit of two answered
])
def test_units_state(lines, state):
    assert units_state(lines, 2) == state
