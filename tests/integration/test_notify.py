"""Rollout notifications (issue 13, item 5) on a simulated fleet of two nodes, told to a real
HTTP receiver on this host: a halted run (the canary's soak catches the pre-fix crash) and a
converged one (a profile change, no install), each event in order to a generic-JSON webhook with a bearer token and to a
Slack-style one; a webhook that answers 500 and one that nobody listens on fail neither run
and are recorded in notifications.json. The token and the Slack URL are in no output and no
report.

Tests run in file order on one fleet (one provisioning)."""
from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.fixtures.simnode.simnode import free_port
from tests.fixtures.story import ACCEPT_PRE_FIX, FP8, NVFP4, PRE_FIX, PRE_FIX_ID, play, provisioned_fleet, state

NODES = ["node01", "node02"]
TOKEN = "notify-token-7Qx2.Zr9"
SLACK_SECRET = "T0001/B0002/slacksecret42"
# The converged run changes the profile alone (the release is on the nodes already): a turn
# for each node without an install, which the notifications do not need.
FP8_RESEEDED = {**FP8, "env": {**FP8["env"], "VLLM_STANDIN_SEED": "3"}}
CONVERGE = {"release": PRE_FIX, "profile_": FP8_RESEEDED, "accept": ACCEPT_PRE_FIX, "vllm_fleet_rollout_soak": False}


class Receiver:
    """A webhook receiver on a loopback port: records every POST; paths under /fail answer 500."""

    def __init__(self):
        self.requests: list[dict] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append({"path": self.path, "authorization": self.headers.get("Authorization"),
                                 "content_type": self.headers.get("Content-Type"), "body": json.loads(body)})
                self.send_response(500 if self.path.startswith("/fail") else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[dict]:
        return [r["body"] for r in self.requests if r["path"] == path]


@pytest.fixture(scope="module")
def fleet(node_image, tmp_path_factory):
    with provisioned_fleet(tmp_path_factory.mktemp("notify"), f"vf-notify-{os.getpid()}-", len(NODES)) as sim:
        yield sim


@pytest.fixture(scope="module")
def receiver():
    rec = Receiver()
    yield rec
    rec.server.shutdown()
    rec.server.server_close()


@pytest.fixture(scope="module")
def webhooks(fleet, receiver):
    """The JSON webhook's token and the Slack one's URL in root-only files, as an operator keeps them."""
    secrets = fleet.directory / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "json.token").write_text(TOKEN + "\n")
    (secrets / "slack.url").write_text(f"{receiver.url}/slack/{SLACK_SECRET}\n")
    for path in secrets.iterdir():
        path.chmod(0o600)
    return [{"name": "ops-json", "url": f"{receiver.url}/json", "token_file": str(secrets / "json.token")},
            {"name": "ops-chat", "url_file": str(secrets / "slack.url"), "format": "slack"},
            {"name": "broken", "url": f"{receiver.url}/fail"},
            {"name": "nobody", "url": f"http://127.0.0.1:{free_port()}/hook"}]


def rollout(fleet, webhooks, **target):
    return play(fleet, "rollout.yml", vllm_fleet_notify_webhooks=webhooks, vllm_fleet_notify_timeout=3, **target)


def events(bodies: list[dict]) -> list[tuple]:
    return [(b["event"], b["host"], b["status"]) for b in bodies]


def recorded(fleet) -> list[dict]:
    path = fleet.directory / "reports" / "notifications.json"
    return json.loads(path.read_text()) if path.exists() else []


def assert_no_secret(fleet, output: str) -> None:
    for secret in (TOKEN, SLACK_SECRET):
        assert secret not in output
        for path in (fleet.directory / "reports").rglob("*"):
            assert not path.is_file() or secret not in path.read_text(errors="replace"), (secret, path)


def test_a_halted_rollout_tells_its_start_the_canarys_verdict_and_the_halt(fleet, receiver, webhooks):
    # The pre-fix release under NVFP4, accepted on purpose: the canary's soak sees it crash.
    run = rollout(fleet, webhooks, release=PRE_FIX, profile_=NVFP4, accept=ACCEPT_PRE_FIX)
    assert run.rc != 0 and "rollout halted at node01" in run.output, run.output[-4000:]

    sent = receiver.bodies("/json")
    assert events(sent) == [("started", None, None), ("verdict", "node01", "rolled_back"),
                            ("halted", "node01", "rolled_back")]  # no converged, node02 never had a turn
    rollout_id = sent[0]["rollout"]
    assert rollout_id and {b["rollout"] for b in sent} == {rollout_id}
    assert sent[0]["release"] == PRE_FIX_ID and sent[0]["profile"] == NVFP4["name"]
    assert sent[1]["release"] == PRE_FIX_ID and sent[1]["message"]  # what it serves again, and why
    assert [r["authorization"] for r in receiver.requests if r["path"] == "/json"] == [f"Bearer {TOKEN}"] * 3

    texts = [b["text"] for b in receiver.bodies(f"/slack/{SLACK_SECRET}")]
    assert len(texts) == 3 and "started" in texts[0] and "node01 rolled_back" in texts[1], texts
    assert "HALTED at node01 (rolled_back)" in texts[2], texts
    assert all(r["authorization"] is None for r in receiver.requests if r["path"].startswith("/slack"))
    assert_no_secret(fleet, run.output)


def test_a_converged_rollout_tells_each_verdict_in_order_and_survives_failing_webhooks(fleet, receiver, webhooks):
    receiver.requests.clear()
    before = recorded(fleet)
    run = rollout(fleet, webhooks, **CONVERGE)
    assert run.rc == 0, run.output[-4000:]
    for node in NODES:
        assert state(fleet, node)["current"] == PRE_FIX_ID, node

    expected = [("started", None, None), ("verdict", "node01", "upgraded"), ("verdict", "node02", "upgraded"),
                ("converged", None, None)]
    sent = receiver.bodies("/json")
    assert events(sent) == expected
    assert {b["release"] for b in sent} == {PRE_FIX_ID} and {b["profile"] for b in sent} == {FP8["name"]}
    assert all(r["content_type"] == "application/json" for r in receiver.requests)
    texts = [b["text"] for b in receiver.bodies(f"/slack/{SLACK_SECRET}")]
    assert len(texts) == 4, texts
    for text, words in zip(texts, ("started", "node01 upgraded", "node02 upgraded", "converged")):
        assert words in text and PRE_FIX_ID in text, (words, text)

    # Negative control: the failing webhook really was contacted, once per event.
    assert events(receiver.bodies("/fail")) == expected
    # The failures of this run, each event for each failing webhook, redacted and with the error.
    new = recorded(fleet)[len(before):]
    assert sorted((e["webhook"], e["event"]) for e in new) == sorted(
        (hook, event) for hook in ("broken", "nobody") for event in ("started", "verdict", "verdict", "converged"))
    for entry in new:
        assert entry["rollout"] == sent[0]["rollout"] and entry["url"].endswith("/...")
        assert ("Status code was 500" if entry["webhook"] == "broken" else "Connection refused") in entry["error"]
    assert f"WARNING: notification started to broken (http://127.0.0.1:{receiver.server.server_port}/...) failed" \
        in run.output
    # The halted run's failures are still there: the file is appended to.
    assert {e["event"] for e in before} == {"started", "verdict", "halted"}
    assert_no_secret(fleet, run.output)


def test_a_token_file_others_can_read_is_refused_before_anything_changes(fleet, receiver, webhooks):
    token_file = webhooks[0]["token_file"]
    receiver.requests.clear()
    os.chmod(token_file, 0o644)
    try:
        run = rollout(fleet, webhooks, **CONVERGE)
    finally:
        os.chmod(token_file, 0o600)
    assert run.rc != 0
    assert (f"vllm_fleet_notify_webhooks[0].token_file: {token_file} is mode 0644; it must be readable by its owner "
            "only (0600 or 0400)") in run.output, run.output[-3000:]
    assert "Take the rollout lock" not in run.output and receiver.requests == []
    assert TOKEN not in run.output
