"""fleet_notify's filters: the payloads (the generic schema and Slack's), the checks of the
webhooks and of their root-only files, and the failures recorded without secrets."""
import os

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.filter.notify import (
    FIELDS, NotifyError, check, failures, payload, read_secret, redact, requests,
)

EVENT = {"event": "verdict", "rollout": "0f1e2d3c-aaaa-bbbb-cccc-123456789abc", "host": "node01",
         "status": "rolled_back", "release": "vllm-0.25.1_nvidia-cudnn-cu13-9.19.0.56",
         "profile": "qwen3.6-35b-a3b-nvfp4-sm120", "message": "soak: engine died", "time": "2026-12-04T18:00:00Z"}
TOKEN = "tok-3f9a.secret_value"


def secret(tmp_path, name, text, mode=0o600):
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


def test_the_generic_payload_has_every_field_null_where_the_event_has_none():
    assert payload(EVENT, "json") == EVENT
    started = payload({"event": "started", "release": "r1"}, "json")
    assert list(started) == list(FIELDS)
    assert started["release"] == "r1" and started["host"] is None and started["message"] is None


@pytest.mark.parametrize("event, words", [
    (EVENT, ["Rollout 0f1e2d3c", "node01 rolled_back", "serves vllm-0.25.1_nvidia-cudnn-cu13-9.19.0.56",
             "\nsoak: engine died"]),
    ({**EVENT, "event": "halted"}, ["HALTED at node01 (rolled_back)"]),
    ({"event": "started", "rollout": "abc", "release": "r1", "profile": "p"}, ["Rollout abc started: r1 with profile p"]),
    ({"event": "converged", "release": "r1", "profile": "p"}, ["Rollout - converged: r1 with profile p"]),
], ids=["verdict", "halted", "started", "converged"])
def test_the_slack_payload_is_one_text_per_event(event, words):
    body = payload(event, "slack")
    assert list(body) == ["text"]
    for word in words:
        assert word in body["text"], (word, body)
    assert "None" not in body["text"]


def test_an_unknown_event_is_refused():
    with pytest.raises(NotifyError, match="'stopped' is not one of started, verdict, halted, converged"):
        requests([{"url": "http://h/x"}], {"event": "stopped"})


def test_a_request_carries_the_token_as_a_bearer_header_and_the_format_asked(tmp_path):
    hooks = [{"name": "ops", "url_file": secret(tmp_path, "url", "https://hooks.example.com/T1/B2/s3cr3t"),
              "token_file": secret(tmp_path, "token", TOKEN, 0o400)},
             {"url": "http://127.0.0.1:9/hook", "format": "slack"}]
    first, second = requests(hooks, EVENT)
    assert first["url"] == "https://hooks.example.com/T1/B2/s3cr3t"
    assert first["headers"] == {"Authorization": f"Bearer {TOKEN}"} and first["body"] == EVENT
    assert first["label"] == "ops"
    assert second["headers"] == {} and list(second["body"]) == ["text"]
    assert second["label"] == "vllm_fleet_notify_webhooks[1]"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o200])
def test_a_secret_file_others_can_read_is_refused(tmp_path, mode):
    path = secret(tmp_path, "token", TOKEN, mode)
    with pytest.raises(NotifyError) as caught:
        read_secret(path, "vllm_fleet_notify_webhooks[0].token_file")
    assert str(caught.value) == (f"vllm_fleet_notify_webhooks[0].token_file: {path} is mode {mode:04o}; it must be "
                                 f"readable by its owner only (0600 or 0400): it holds a secret. Fix it with: "
                                 f"chmod 0600 {path}")


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_secret_file_only_its_owner_reads_is_read(tmp_path, mode):  # negative control
    assert read_secret(secret(tmp_path, "token", TOKEN, mode), "t") == TOKEN


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_secret_file_another_user_owns_is_refused(tmp_path):
    path = secret(tmp_path, "token", TOKEN)
    os.chown(path, 65534, 65534)
    with pytest.raises(NotifyError, match=r"is owned by uid 65534, not by the user that runs Ansible \(uid 0\)"):
        read_secret(path, "t")


def test_a_missing_empty_or_odd_file_is_refused(tmp_path):
    with pytest.raises(NotifyError, match="cannot be read: No such file"):
        read_secret(str(tmp_path / "none"), "t")
    with pytest.raises(NotifyError, match="is empty"):
        read_secret(secret(tmp_path, "empty", ""), "t")
    with pytest.raises(NotifyError, match="is not a regular file"):
        read_secret(str(tmp_path), "t")


def test_check_names_each_entry_and_key_and_never_a_secret(tmp_path):
    leaky = secret(tmp_path, "leaky", TOKEN, 0o644)
    problems = check([
        {"url": "https://user:pw@hooks.example.com/T1/s3cr3t"},                       # fine
        {"url": "ftp://user:pw@files.example.com/s3cr3t", "colour": "red"},
        {"url": "https://h/x", "url_file": "/f"},
        {"token": "a b", "url": "https://h/x"},
        {"url": "https://h/x", "token_file": leaky, "format": "xml"},
        {"url": "https://h/x", "token_file": leaky},
        "https://h/x",
    ])
    assert problems == [
        "vllm_fleet_notify_webhooks[1]: unknown keys colour; known: format, name, token, token_file, url, url_file",
        "vllm_fleet_notify_webhooks[2]: give exactly one of url (a vault-encrypted variable) and url_file "
        "(a root-only file)",
        "vllm_fleet_notify_webhooks[3].token: the token must be printable ASCII without spaces (it is sent as "
        "'Authorization: Bearer <token>')",
        "vllm_fleet_notify_webhooks[4].format: 'xml' is not one of json, slack",
        f"vllm_fleet_notify_webhooks[5].token_file: {leaky} is mode 0644; it must be readable by its owner only "
        f"(0600 or 0400): it holds a secret. Fix it with: chmod 0600 {leaky}",
        "vllm_fleet_notify_webhooks[6]: str is not a mapping of url or url_file, token or token_file, "
        "format (json or slack) and name",
    ]
    assert check([{"url": "ftp://user:pw@files.example.com/s3cr3t"}]) == [
        "vllm_fleet_notify_webhooks[0].url: ftp://files.example.com/... is not an http:// or https:// URL with a host"]
    assert check("https://h/x") == ["vllm_fleet_notify_webhooks: a str is not a list of webhooks"]
    assert check([]) == []


@pytest.mark.parametrize("url, shown", [
    ("https://user:pw@hooks.example.com:8443/services/T1/B2/s3cr3t?x=1", "https://hooks.example.com:8443/..."),
    ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
    ("http://[::1]:9000/h", "http://[::1]:9000/..."),
])
def test_a_url_is_shown_without_credentials_path_or_query(url, shown):
    assert redact(url) == shown


def test_failures_are_the_non_2xx_answers_and_the_unbuilt_requests_without_secrets():
    url = "http://u:pw@127.0.0.1:9/hook/s3cr3t"
    sent = {"label": "a", "event": "started", "url": url, "token": TOKEN}
    results = [
        {"item": sent, "status": 204},
        {"item": sent, "status": 500, "msg": f"Status code was 500 for {url} with Bearer {TOKEN}"},
        {"item": sent, "status": -1, "msg": "Request failed: <urlopen error [Errno 111] Connection refused>"},
        {"item": {"label": "b", "event": "started", "error": "vllm_fleet_notify_webhooks[1].url_file: ... is empty"},
         "skipped": True},
        {"item": sent, "skipped": True},
    ]
    assert failures(results) == [
        {"event": "started", "webhook": "a", "url": "http://127.0.0.1:9/...",
         "error": "Status code was 500 for http://127.0.0.1:9/... with Bearer ***"},
        {"event": "started", "webhook": "a", "url": "http://127.0.0.1:9/...",
         "error": "Request failed: <urlopen error [Errno 111] Connection refused>"},
        {"event": "started", "webhook": "b", "url": None, "error": "vllm_fleet_notify_webhooks[1].url_file: ... is empty"},
    ]


def test_a_file_that_broke_after_the_check_becomes_an_error_not_a_request(tmp_path):
    path = secret(tmp_path, "url", "https://h/x")
    os.chmod(path, 0o644)
    built, = requests([{"name": "ops", "url_file": path}], EVENT)
    assert "url" not in built and "is mode 0644" in built["error"]
