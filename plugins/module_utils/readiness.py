"""Readiness of a node's vLLM instances after a (re)start, polled on the node itself.

Plain Python, stdlib only, no ``ansible`` import: the ``vllm_ready`` module calls
``wait_ready``; the tests call it against a local HTTP server and a fake ``systemctl``.

One module run polls what used to be one SSH module run per retry:

1. systemd: every unit ``ActiveState=active`` with no job pending (the start, model load and
   ``/health`` 200 in the unit's ExecStartPost, has finished with the new process); a unit
   that reports ``ActiveState=failed`` stops the wait at once (start limit);
2. per instance ``/health`` 200, then ``/v1/models`` listing a model (``/health`` alone is
   green before a model serves), with the first of several API keys the first instance
   accepts (a rotation's window);
3. per instance one real completion that returns text.

All within one deadline. A failure raises ``NotReady``, whose ``message`` carries the stage, the
last answer, systemd's view and the end of each instance's journal; never a key.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

SHOW_PROPERTIES = "Id,ActiveState,SubState,Job,NRestarts"
JOURNAL_LINES = 40
START_LIMIT = "an instance failed and systemd stopped restarting it (start limit); its journal says why"
# The stages, as an operator reads them in the failure message.
STAGE_SYSTEMD = "Wait until systemd has started every instance (model loaded, /health answered)"
STAGE_FAILED = "Fail when an instance gave up starting"
STAGE_HEALTH = "Check /health of each instance"
STAGE_KEY = "Find which accepted key the instances take (a rotation's window)"
STAGE_MODELS = "Read the model each instance serves"
STAGE_COMPLETION = "Ask each instance for a real completion"
# The probes go to the node's own instances: never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NotReady(Exception):
    """The instances did not serve in time; ``message`` is what the operator reads."""

    def __init__(self, message: str, stage: str, systemd: list[str]):
        super().__init__(message)
        self.message, self.stage, self.systemd = message, stage, systemd


def run_command(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run argv; (rc, stdout, stderr). A command that cannot run is rc 127 with the reason."""
    try:
        done = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def units_state(lines: list[str], count: int) -> str:
    """'failed', 'ready' (every unit active, no job) or 'starting', from `systemctl show` lines."""
    if "ActiveState=failed" in lines:
        return "failed"
    if lines.count("ActiveState=active") == count and lines.count("Job=") == count:
        return "ready"
    return "starting"


def journal(name: str, run=run_command, timeout: float = 30) -> str:
    """The end of instance name's journal, as the failure message shows it."""
    rc, out, err = run(["journalctl", "--no-pager", "--output=short-iso", f"--lines={JOURNAL_LINES}",
                        "--unit", f"vllm@{name}.service"], timeout)
    return out.rstrip("\n") if rc == 0 or out else f"(journalctl exited {rc}: {err.strip()})"


def _url(host: str, port: int, path: str) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def request(url: str, timeout: float, key: str | None = None, body: dict | None = None) -> tuple[int, object, str]:
    """One HTTP request: (status, parsed JSON or None, what to say about it). Status 0: no answer."""
    headers = {"Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with _OPENER.open(req, timeout=timeout) as answer:
            status, text = answer.status, answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace") if exc.fp else ""
        return exc.code, None, f"HTTP {exc.code} {text.strip()[:300]}".rstrip()
    except (urllib.error.URLError, OSError, socket.timeout) as exc:
        return 0, None, f"no answer: {getattr(exc, 'reason', exc)}"
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = None
    return status, parsed, f"HTTP {status} {text.strip()[:300]}".rstrip()


def _seconds(value: float) -> str:
    return f"{value:g}"


class _Stop(Exception):
    """A stage gave up: the deadline passed, or a unit failed."""

    def __init__(self, stage: str, reason: str):
        super().__init__(reason)
        self.stage, self.reason = stage, reason


class _Wait:
    """One deadline for every stage, and systemd's last answer for the failure message."""

    def __init__(self, timeout: float, delay: float, clock, sleep):
        self.delay, self.clock, self.sleep = delay, clock, sleep
        self.deadline = clock() + timeout
        self.systemd: list[str] = []
        self.polls = 0

    def until(self, stage: str, attempt, *args):
        """attempt(*args) -> (done, value when done else why not); tried at least once, then
        every delay seconds until the deadline."""
        while True:
            self.polls += 1
            done, value = attempt(*args)
            if done:
                return value
            left = self.deadline - self.clock()
            if left <= 0:
                raise _Stop(stage, value)
            self.sleep(min(self.delay, left))


def wait_ready(instances: list[dict], units: list[str], host: str, keys: list[str], timeout: float,
               delay: float, request_timeout: float, prompt: str, max_tokens: int,
               run=run_command, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Wait until every instance ({name, port}) serves, as the module docstring says.

    Returns {instances: [{name, port, model, completion_tokens}], systemd: [lines], key_index:
    the index in keys of the key the instances take (None without keys), polls: the systemctl
    runs and HTTP requests made}. Raises NotReady."""
    wait = _Wait(timeout, delay, clock, sleep)
    try:
        return _wait(wait, instances, units, host, keys, request_timeout, prompt, max_tokens, run)
    except _Stop as stop:
        lines = [f'vLLM instances not ready (limit {_seconds(timeout)} s), at "{stop.stage}":', stop.reason,
                 "systemd: " + ", ".join(wait.systemd)]
        for instance in instances:
            lines += [f"--- journalctl -u vllm@{instance['name']} (last {JOURNAL_LINES} lines) ---",
                      journal(instance["name"], run)]
        raise NotReady("\n".join(lines), stop.stage, wait.systemd) from None


def _wait(wait: _Wait, instances, units, host, keys, request_timeout, prompt, max_tokens, run) -> dict:
    argv = ["systemctl", "show", f"--property={SHOW_PROPERTIES}"] + [f"{unit}.service" for unit in units]
    wait.until(STAGE_SYSTEMD, _started, wait, argv, len(units), run, request_timeout)

    def url(instance, path):
        return _url(host, instance["port"], path)

    for instance in instances:
        wait.until(STAGE_HEALTH, _healthy, instance, url(instance, "/health"), request_timeout)
    key_index = 0 if keys else None
    if len(keys) > 1:
        key_index = wait.until(STAGE_KEY, _accepted_key, keys, url(instances[0], "/v1/models"), request_timeout)
    key = keys[key_index] if keys else None
    models = [wait.until(STAGE_MODELS, _model, instance, url(instance, "/v1/models"), request_timeout, key)
              for instance in instances]
    served = []
    for instance, model in zip(instances, models):
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        answer = wait.until(STAGE_COMPLETION, _completion, instance, url(instance, "/v1/completions"),
                            request_timeout, key, body)
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        served.append({"name": instance["name"], "port": instance["port"], "model": answer.get("model"),
                       "completion_tokens": usage.get("completion_tokens")})
    return {"instances": served, "systemd": wait.systemd, "key_index": key_index, "polls": wait.polls}


def _started(wait: _Wait, argv, count, run, timeout):
    rc, out, err = run(argv, timeout)
    wait.systemd = [line for line in out.splitlines() if line]
    if rc != 0:
        return False, f"systemctl show exited {rc}: {err.strip()}"
    state = units_state(wait.systemd, count)
    if state == "failed":
        raise _Stop(STAGE_FAILED, START_LIMIT)
    return state == "ready", "not every instance is active with no job pending"


def _why(instance, said: str) -> str:
    return f"last answer of {instance['name']} (port {instance['port']}): {said}"


def _healthy(instance, url, timeout):
    status, _, said = request(url, timeout)
    return status == 200, None if status == 200 else _why(instance, said)


def _accepted_key(keys, url, timeout):
    """(True, index) of the first key /v1/models takes (200; the others 401); the first key when
    every one is refused (the models stage then says so); not done while an answer is neither."""
    for index, key in enumerate(keys):
        status, _, said = request(url, timeout, key)
        if status == 200:
            return True, index
        if status != 401:
            return False, f"last answer to key {index}: {said}"
    return True, 0


def _model(instance, url, timeout, key):
    """(True, the first model's id) once /v1/models lists one."""
    status, data, said = request(url, timeout, key)
    listed = data.get("data") if isinstance(data, dict) else None
    ids = [item.get("id") for item in listed if isinstance(item, dict)] if isinstance(listed, list) else []
    if status == 200 and ids and isinstance(ids[0], str) and ids[0]:
        return True, ids[0]
    return False, _why(instance, said)


def _completion(instance, url, timeout, key, body):
    """(True, the answer) once a completion returns text."""
    status, data, said = request(url, timeout, key, body)
    try:
        text = data["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        text = None
    if status == 200 and isinstance(text, str) and text:
        return True, data
    return False, _why(instance, said)
