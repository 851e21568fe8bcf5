# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

"""Filters of the fleet_notify role: check the webhooks, build each event's requests, pick out
the notifications that failed. Plain Python below (unit-tested in tests/unit/test_notify.py);
their documentation is in the sidecar YAML files next to this one.
"""

import os
from urllib.parse import urlsplit

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.secret_file import SecretFileError, read_secret_file

VARIABLE = "vllm_fleet_notify_webhooks"
EVENTS = ("started", "verdict", "halted", "converged")
FORMATS = ("json", "slack")
KEYS = {"name", "url", "url_file", "token", "token_file", "format"}
# The generic schema: every key present, null where the event has no value.
FIELDS = ("event", "rollout", "host", "status", "release", "profile", "message", "time")
# One line each in Slack; the message, where there is one, follows.
SLACK_TEXT = {
    "started": "Rollout {rollout} started: {release} with profile {profile}",
    "verdict": "Rollout {rollout}: {host} {status}, serves {release}",
    "halted": "Rollout {rollout} HALTED at {host} ({status}), which serves {release}",
    "converged": "Rollout {rollout} converged: {release} with profile {profile}",
}


class NotifyError(Exception):
    pass


def redact(url):
    """The URL without credentials, query or path (a Slack webhook's path is its secret)."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<not a URL>"
    if ":" in host:
        host = f"[{host}]"
    rest = "/..." if parts.path not in ("", "/") or parts.query else ""
    return f"{parts.scheme}://{host}{port}{rest}"


def read_secret(path, what):
    """A URL or token from a file the controller user owns and no one else can read."""
    try:
        return read_secret_file(path, what, owner_uid=os.geteuid(), owner="the user that runs Ansible")
    except SecretFileError as exc:
        raise NotifyError(str(exc)) from None


def check_url(url, what):
    """Named by its redacted form: the URL itself may be a secret."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise NotifyError(f"{what}: {redact(url)!s} is not an http:// or https:// URL with a host")
    return url


def check_token(token, what):
    # It becomes an HTTP header: no line breaks, spaces or control characters.
    if not token or not all(33 <= ord(c) < 127 for c in token):
        raise NotifyError(f"{what}: the token must be printable ASCII without spaces (it is sent as "
                          "'Authorization: Bearer <token>')")
    return token


def _label(hook, index):
    return str(hook.get("name") or f"{VARIABLE}[{index}]")


def _where(index, key):
    return f"{VARIABLE}[{index}].{key}"


def _shape(hook, index):
    """What is wrong with one webhook's keys, without reading its files."""
    if not isinstance(hook, dict):
        return [f"{VARIABLE}[{index}]: {type(hook).__name__} is not a mapping of url or url_file, token or "
                "token_file, format (json or slack) and name"]
    errors = []
    unknown = sorted(set(hook) - KEYS)
    if unknown:
        errors.append(f"{VARIABLE}[{index}]: unknown keys {', '.join(map(str, unknown))}; known: {', '.join(sorted(KEYS))}")
    if bool(hook.get("url")) == bool(hook.get("url_file")):
        errors.append(f"{VARIABLE}[{index}]: give exactly one of url (a vault-encrypted variable) and url_file "
                      "(a root-only file)")
    if hook.get("token") and hook.get("token_file"):
        errors.append(f"{VARIABLE}[{index}]: give at most one of token and token_file")
    fmt = hook.get("format", "json")
    if fmt not in FORMATS:
        errors.append(f"{_where(index, 'format')}: {str(fmt)[:40]!r} is not one of {', '.join(FORMATS)}")
    return errors


def _secrets(hook, index):
    """The URL and the token (or None), read and checked."""
    if hook.get("url_file"):
        url = read_secret(str(hook["url_file"]), _where(index, "url_file"))
    else:
        url = str(hook["url"])
    check_url(url, _where(index, "url_file" if hook.get("url_file") else "url"))
    token = None
    if hook.get("token_file"):
        token = check_token(read_secret(str(hook["token_file"]), _where(index, "token_file")),
                            _where(index, "token_file"))
    elif hook.get("token"):
        token = check_token(str(hook["token"]), _where(index, "token"))
    return url, token


def check(webhooks):
    """Every problem of the webhooks, each naming the entry and the key; never a secret."""
    if not isinstance(webhooks, list):
        return [f"{VARIABLE}: a {type(webhooks).__name__} is not a list of webhooks"]
    errors = []
    for index, hook in enumerate(webhooks):
        shape = _shape(hook, index)
        errors += shape
        if not shape:
            try:
                _secrets(hook, index)
            except NotifyError as exc:
                errors.append(str(exc))
    return errors


def payload(event, fmt):
    """The body that tells one event: the generic schema, or Slack's {"text": ...}."""
    body = {key: event.get(key) for key in FIELDS}
    if fmt == "json":
        return body
    fields = {key: "-" if value is None else value for key, value in body.items()}
    fields["rollout"] = str(fields["rollout"])[:8]
    text = SLACK_TEXT[body["event"]].format(**fields)
    if body["message"]:
        text += f"\n{body['message']}"
    return {"text": text}


def requests(webhooks, event):
    """One request per webhook; a webhook that cannot be built comes back with its error instead."""
    if event.get("event") not in EVENTS:
        raise NotifyError(f"event: {str(event.get('event'))[:40]!r} is not one of {', '.join(EVENTS)}")
    built = []
    for index, hook in enumerate(webhooks):
        label = _label(hook, index) if isinstance(hook, dict) else f"{VARIABLE}[{index}]"
        entry = {"label": label, "event": event.get("event")}
        try:
            problems = _shape(hook, index)
            if problems:
                raise NotifyError("; ".join(problems))
            url, token = _secrets(hook, index)
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            entry.update(url=url, token=token, headers=headers, body=payload(event, hook.get("format", "json")))
        except NotifyError as exc:
            entry["error"] = str(exc)
        built.append(entry)
    return built


def failures(results):
    """The notifications that did not get a 2xx answer, from a uri loop's results over requests()."""
    failed = []
    for result in results:
        request = result.get("item", {})
        if "error" in request:
            error = request["error"]
        elif result.get("skipped"):
            continue
        elif 200 <= int(result.get("status", -1)) < 300 and not result.get("failed"):
            continue
        else:
            error = str(result.get("msg") or f"HTTP {result.get('status', -1)}")
            # uri may quote the URL or the request: neither leaves this filter.
            for secret, shown in ((request.get("url"), redact(request.get("url", ""))), (request.get("token"), "***")):
                if secret:
                    error = error.replace(secret, shown)
        failed.append({"event": request.get("event"), "webhook": request.get("label"),
                       "url": redact(request["url"]) if request.get("url") else None, "error": error[:1000]})
    return failed


def notify_requests(webhooks, event):
    try:
        return requests(webhooks, event)
    except NotifyError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"notify_check": check, "notify_requests": notify_requests, "notify_failures": failures}
