"""vLLM's Prometheus metrics and the one notion of engine progress the project uses.

Plain Python, stdlib only, no ``ansible`` import, and no import of any other module of the
collection: the soak gate (``soak.py``, shipped by Ansible), the node watchdog
(``watchdog.py``, copied onto the node next to this file) and the ``vllm_metrics`` module
all read it.

* ``parse_prometheus`` / ``metric_sum`` / ``metric_max``: the text exposition format.
* ``SERIES`` / ``aggregate``: one aggregation rule per metric across a scrape's
  ``model_name``/``engine`` label sets.
* ``EngineMetrics``: the series of one ``/metrics`` answer that say whether the engine works;
  its ``missing``: the series a judgement needs that a scrape lacked ("metrics
  incomplete"), the same rule for the soak and the watchdog; its ``progress_marker``:
  generated tokens and requests the engine finished its work on (``FINISHED_WORK``).
  Nothing else counts: prompt tokens can be counted as requests arrive, and clients that
  time out and retry keep them (and the queue) moving while a wedged engine generates
  nothing. A wedged engine (vLLM answers ``/health`` 200) moves neither.
"""

from __future__ import annotations

import math
import re
import urllib.error
from dataclasses import dataclass

# One rule per metric across a scrape's label sets (model_name, engine, finished_reason):
# counters and queue gauges add up over engines; KV usage is a fraction of each engine's own
# cache, so the fullest engine is what matters (two engines at 0.43 are not 0.86 full).
# attribute -> (series, rule)
SERIES = {
    "running": ("vllm:num_requests_running", "sum"),
    "waiting": ("vllm:num_requests_waiting", "sum"),
    "generation_tokens": ("vllm:generation_tokens_total", "sum"),
    "prompt_tokens": ("vllm:prompt_tokens_total", "sum"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "max"),
    "success_total": ("vllm:request_success_total", "sum"),
    "preemptions": ("vllm:num_preemptions_total", "sum"),
}
# The finished_reason values of vllm:request_success_total that are the engine's work done.
# Real 0.25.1 has five (v1/engine/__init__.py, FINISH_REASON_STRINGS; every one is exported,
# v1/metrics/loggers.py): "stop", "length" and "repetition" (a repetition_detection the
# client's sampling parameters asked for) end a generation; "abort" is a client giving up and
# "error" a request the engine failed (answered 500): neither is progress. An allow-list, so
# a reason a later vLLM adds is not taken for progress unseen.
FINISHED_WORK = ("stop", "length", "repetition")
# The attributes whose values form the progress marker, in this order: generated tokens and
# requests finished by the engine (request_success_total over FINISHED_WORK).
PROGRESS_FIELDS = ("generation_tokens", "finished")
# What judging progress needs: in flight (running + waiting) and generated tokens.
REQUIRED_FIELDS = ("running", "waiting", "generation_tokens")


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


def aggregate(series: dict, name: str) -> float | None:
    """``name`` over its label sets by its rule in ``SERIES`` (sum unless listed as max)."""
    rule = next((r for series_name, r in SERIES.values() if series_name == name), "sum")
    return metric_max(series, name) if rule == "max" else metric_sum(series, name)


def finished_requests(series: dict) -> float | None:
    """Requests the engine finished its work on (finished_reason in FINISHED_WORK); None if absent."""
    values = [value for labels, value in series.get("vllm:request_success_total", ())
              if labels.get("finished_reason") in FINISHED_WORK and not math.isnan(value)]
    return sum(values) if "vllm:request_success_total" in series else None


# --------------------------------------------------------------------------- progress

@dataclass(frozen=True)
class EngineMetrics:
    """The load and progress series of one ``/metrics`` answer, each aggregated over its
    label sets by its rule in ``SERIES``; ``finished`` as ``finished_requests``. None: absent."""

    running: float | None = None
    waiting: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    kv_usage: float | None = None
    success_total: float | None = None
    preemptions: float | None = None
    finished: float | None = None

    @classmethod
    def from_text(cls, text: str) -> "EngineMetrics":
        series = parse_prometheus(text)
        return cls(finished=finished_requests(series),
                   **{attr: aggregate(series, name) for attr, (name, _) in SERIES.items()})

    @property
    def read(self) -> bool:
        """Whether any series of ``SERIES`` was read at all (else: no metrics, not incomplete ones)."""
        return any(getattr(self, attr) is not None for attr in SERIES)

    @property
    def in_flight(self) -> float | None:
        """Requests running plus waiting; None when either was not read (a missing gauge is
        unknown, not zero)."""
        if self.running is None or self.waiting is None:
            return None
        return self.running + self.waiting

    @property
    def progress_marker(self) -> tuple | None:
        """Generated tokens and finished requests; None when the metrics were not read (no
        ``vllm:generation_tokens_total``): no evidence either way. Two markers differ exactly
        when the engine made progress between them (a restarted process starts its counters
        again, which differs too)."""
        if self.generation_tokens is None:
            return None
        return (self.generation_tokens, self.finished or 0.0)

    @property
    def missing(self) -> list[str]:
        """The series progress cannot be judged without that a scrape lacked, by name; [] when
        none lacks, or when nothing was read at all. The soak and the watchdog both report a
        non-empty answer as "metrics incomplete: <names>" and judge nothing from that scrape."""
        if not self.read:
            return []
        return [SERIES[attr][0] for attr in REQUIRED_FIELDS if getattr(self, attr) is None]


def incomplete_message(missing: list[str]) -> str:
    """The one wording of "metrics incomplete", for the soak's verdict and the watchdog's."""
    return (f"metrics incomplete: {', '.join(missing)} missing from /metrics, so a wedged engine cannot be told "
            "from an idle one")


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
