"""vLLM's Prometheus metrics and the one notion of engine progress the project uses.

Plain Python, stdlib only, no ``ansible`` import, and no import of any other module of the
collection: the soak gate (``soak.py``, shipped by Ansible) and the node watchdog
(``watchdog.py``, copied onto the node next to this file) both read it.

* ``parse_prometheus`` / ``metric_sum`` / ``metric_max``: the text exposition format.
* ``EngineMetrics``: the series of one ``/metrics`` answer that say whether the engine works.
* ``progress_marker``: everything that moves while the engine makes progress. ANY movement
  counts -- generated tokens, prompt tokens, KV cache usage, finished requests, preemptions
  -- because a batch of ~81k-token prompts prefills for minutes without generating a token
  while the KV cache fills. A wedged engine (vLLM answers ``/health`` 200) moves none.
"""

from __future__ import annotations

import math
import re
import urllib.error
from dataclasses import dataclass

# The attributes whose values form the progress marker, in this order.
PROGRESS_FIELDS = ("generation_tokens", "prompt_tokens", "kv_usage", "success_total", "preemptions")


# --------------------------------------------------------------------------- Prometheus

_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], value)


def parse_prometheus(text: str, prefix: str = "vllm:") -> dict[str, list[tuple[dict, float]]]:
    """Series whose name starts with ``prefix``: ``{name: [(labels, value), ...]}``.

    The text exposition format as prometheus_client writes it: ``# HELP``/``# TYPE``
    comments, ``name{k="v",...} value [timestamp]``, escaped label values, ``NaN`` and
    ``+Inf``. Histogram parts keep their suffixed names (``_bucket``, ``_sum``, ``_count``).
    Lines that do not parse are skipped: a monitor must not die on one odd line.
    """
    series: dict[str, list[tuple[dict, float]]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(prefix):
            continue
        brace = line.find("{")
        space = line.find(" ")
        labels: dict[str, str] = {}
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            end = line.find("}", brace)
            # a "}" inside a quoted value: find the closing brace after the last quote
            while end != -1 and line[brace:end].count('"') % 2:
                end = line.find("}", end + 1)
            if end == -1:
                continue
            body, rest = line[brace + 1:end], line[end + 1:]
            pos = 0
            while pos < len(body):
                match = _LABEL_RE.match(body, pos)
                if not match:
                    break
                labels[match.group(1)] = _unescape(match.group(2))
                pos = match.end()
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        series.setdefault(name, []).append((labels, value))
    return series


def metric_sum(series: dict, name: str, **match: str) -> float | None:
    """Sum of ``name`` over the label sets that carry every ``match`` label; None if absent."""
    values = [value for labels, value in series.get(name, ())
              if all(labels.get(k) == v for k, v in match.items()) and not math.isnan(value)]
    return sum(values) if values else None


def metric_max(series: dict, name: str) -> float | None:
    values = [value for _, value in series.get(name, ()) if not math.isnan(value)]
    return max(values) if values else None


# --------------------------------------------------------------------------- progress

@dataclass(frozen=True)
class EngineMetrics:
    """The load and progress series of one ``/metrics`` answer, each summed over its
    ``model_name``/``engine`` label sets (KV usage: the fullest engine). None: absent."""

    running: float | None = None
    waiting: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    kv_usage: float | None = None
    success_total: float | None = None
    preemptions: float | None = None

    @classmethod
    def from_text(cls, text: str) -> "EngineMetrics":
        series = parse_prometheus(text)
        return cls(
            running=metric_sum(series, "vllm:num_requests_running"),
            waiting=metric_sum(series, "vllm:num_requests_waiting"),
            generation_tokens=metric_sum(series, "vllm:generation_tokens_total"),
            prompt_tokens=metric_sum(series, "vllm:prompt_tokens_total"),
            kv_usage=metric_max(series, "vllm:kv_cache_usage_perc"),
            success_total=metric_sum(series, "vllm:request_success_total"),
            preemptions=metric_sum(series, "vllm:num_preemptions_total"),
        )

    @property
    def in_flight(self) -> float | None:
        return in_flight(self)

    @property
    def progress_marker(self) -> tuple | None:
        return progress_marker(self)


def in_flight(metrics) -> float | None:
    """Requests running plus waiting of anything with ``running``/``waiting`` attributes;
    None when neither was read."""
    if metrics.running is None and metrics.waiting is None:
        return None
    return (metrics.running or 0) + (metrics.waiting or 0)


def progress_marker(metrics) -> tuple | None:
    """Everything that moves while the engine makes progress, of anything with the
    ``PROGRESS_FIELDS`` attributes (``EngineMetrics``, the soak's ``Sample``).

    None when the metrics were not read (no ``vllm:generation_tokens_total``): no evidence
    either way. Two markers differ -- any field moved -- exactly when the engine made
    progress between them (a restarted process starts its counters again, which differs too).
    """
    if metrics.generation_tokens is None:
        return None
    return tuple(getattr(metrics, name) for name in PROGRESS_FIELDS)


def parse_systemctl_show(text: str) -> dict[str, str]:
    """``Key=Value`` lines of ``systemctl show -p ...`` as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def http_get(opener, url: str, timeout: float) -> tuple[int | None, str | None, str | None]:
    """(status, body, error) of one GET; error is refused / timeout / another reason."""
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace"), None
    except urllib.error.HTTPError as exc:
        return exc.code, None, None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            return None, None, "refused"
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return None, None, "timeout"
        return None, None, f"{type(reason).__name__}: {reason}"
