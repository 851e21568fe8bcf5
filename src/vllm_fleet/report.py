"""The rollout report: one self-contained HTML page per run, for people.

``build_report(report_dir)`` reads what the playbooks left under the run's report dir
(``vllm_fleet_report_dir``, ``<artifacts>/reports`` under the CLI):

  preflight.json                                   the preflight verdict of every targeted node
  rollout/<host>.json                              each node's turn (status, releases, soak gate)
  rollout/<host>/soak/<run>-<instance>/progress.jsonl   one line per soak sample
  rollout/<host>/soak/<run>-<instance>/verdict.json     the soak's verdict

and writes ``rollout.html``: the outcome (converged, halted, blocked), one row per node
with its verdicts, and for every soak three plots over elapsed time -- tokens/s, KV cache
usage, running requests -- with the crashes and wedges marked, and what the soak proved.

Self-contained on purpose: no script, no stylesheet, font or image is fetched (a fleet's
controller often has no internet); the plots are inline SVG drawn here. Every text from a
report is escaped. A missing or garbled file becomes a visible note on the page, never an
exception: the report is written after a run, and a broken run is when it is needed most.
"""
from __future__ import annotations

import html
import json
import math
import os
import re
import traceback
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .events import terminal_text
from .outcome import read_reports

REPORT_FILE = "rollout.html"
PROGRESS_FILE = "progress.jsonl"
VERDICT_FILE = "verdict.json"
MAX_FILE_BYTES = 64 * 1024 * 1024  # a day-long bake at 2 s a sample is ~15 MB of progress
MAX_PLOT_POINTS = 600  # per series; longer soaks are thinned, keeping each bucket's min and max

# Colours: the plot lines and the badges (the Chromium test looks for these pixels).
PLOT_COLORS = {"tokens": "#1f6feb", "kv": "#8250df", "running": "#0e8a8a", "waiting": "#bc4c00"}
MARKER_COLORS = {"crash": "#e3001b", "wedge": "#f08c00"}
STATUS_COLORS = {
    "upgraded": "#1a7f37", "skipped": "#6e7781", "reverted": "#9a6700", "rolled_back": "#cf222e", "failed": "#a40e26",
    "blocked": "#6639ba", "unreachable": "#953800", "not_reached": None, "unknown": None,
}
VERDICT_COLORS = {"passed": "#1a7f37", "failed": "#cf222e", "pass": "#1a7f37", "warn": "#9a6700",
                  "block": "#6639ba"}
OUTCOME_COLORS = {"converged": "#1a7f37", "halted": "#cf222e", "blocked": "#6639ba", "incomplete": "#9a6700",
                  "rolled_back": "#0969da", "failed": "#a40e26", "empty": "#6e7781"}
STATUS_LABELS = {"rolled_back": "rolled back", "not_reached": "not reached"}


def esc(value) -> str:
    """Text for the page: HTML-escaped, and what is not text (controls, lone surrogates, which
    no UTF-8 file can hold) written out as \\xNN / \\uNNNN."""
    return html.escape(terminal_text.escaped("" if value is None else str(value), keep="\n\t"), quote=True)


# =========================================================================== SVG plots

@dataclass
class Series:
    name: str
    color: str
    points: list  # [(x, y or None)], x ascending; None breaks the line (no reading)
    dash: str | None = None
    width: float = 2.0


@dataclass
class Marker:
    x: float
    kind: str  # crash | wedge
    label: str
    x_end: float | None = None  # a span: a wedge from its last progress to its detection
    detail: str = ""  # the evidence, as the tooltip


def nice_step(span: float, target_ticks: int = 5) -> float:
    """A 1-2-2.5-5 x 10^n step that cuts ``span`` into about ``target_ticks`` parts."""
    if not span > 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, target_ticks)
    base = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * base * 1.0000001:
            return mult * base
    return 10 * base


def nice_max(value: float, target_ticks: int = 5) -> float:
    """The first tick at or above ``value`` (at least 1): the top of a y axis."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    step = nice_step(value, target_ticks)
    return round(max(step, math.ceil(value / step - 1e-9) * step), 10)


def ticks(lo: float, hi: float, target_ticks: int = 5) -> list[float]:
    step = nice_step(hi - lo, target_ticks)
    first = math.ceil(lo / step - 1e-9) * step
    out, n = [], 0
    while first + n * step <= hi * (1 + 1e-9) + 1e-12 and n < 50:
        out.append(round(first + n * step, 10))
        n += 1
    return out


def decimate(points: list, max_points: int = MAX_PLOT_POINTS) -> list:
    """At most about ``max_points`` points: each bucket keeps its lowest and highest reading
    (in time order), so a dip to zero or a spike survives; a bucket with a gap keeps it."""
    if len(points) <= max_points:
        return list(points)
    size = math.ceil(len(points) / max(1, max_points // 2))
    out = []
    for start in range(0, len(points), size):
        bucket = points[start:start + size]
        real = [p for p in bucket if p[1] is not None]
        if not real:
            out.append((bucket[0][0], None))
            continue
        lo, hi = min(real, key=lambda p: p[1]), max(real, key=lambda p: p[1])
        picked = sorted({lo, hi}, key=lambda p: p[0])
        if len(real) < len(bucket):  # keep the gap where it was
            gap = next(p for p in bucket if p[1] is None)
            picked = sorted(picked + [gap], key=lambda p: p[0])
        out.extend(picked)
    return out


def plural(n, word: str, words: str | None = None) -> str:
    return f"{n:g} {word if n == 1 else (words or word + 's')}"


def _fmt_num(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def line_plot(title: str, series: list[Series], *, x_max: float, y_max: float | None = None,
              y_format=_fmt_num, markers: list[Marker] = (), width: int = 440, height: int = 230,
              plot_id: str = "plot") -> str:
    """An inline SVG line plot over elapsed seconds, with crash and wedge markers.

    ``y_max`` None scales the y axis to the data (from 0). Values are clamped to the axis.
    """
    left, right, top, bottom = 52, 14, 34, 34
    pw, ph = width - left - right, height - top - bottom
    x_max = x_max if x_max and x_max > 0 else 1.0
    finite = [y for s in series for _, y in s.points if y is not None and math.isfinite(y)]
    top_y = y_max if y_max is not None else nice_max(max(finite, default=0.0))

    def px(x: float) -> float:
        return left + max(0.0, min(1.0, x / x_max)) * pw

    def py(y: float) -> float:
        return top + ph - max(0.0, min(1.0, y / top_y)) * ph

    parts = [f'<svg class="plot" data-plot="{esc(plot_id)}" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{esc(title)}">',
             f"<title>{esc(title)}</title>",
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="{left}" y="16" class="plot-title" font-size="13" font-weight="bold" '
             f'fill="#1f2328">{esc(title)}</text>']
    # y grid and labels
    for value in ticks(0, top_y, 4):
        y = py(value)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d8dee4" '
                     f'stroke-width="1"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#57606a">{esc(y_format(value))}</text>')
    # x axis: seconds for a short soak, minutes for a long one
    in_minutes = x_max > 180
    scale = 60.0 if in_minutes else 1.0
    for value in ticks(0, x_max / scale, 6):
        x = px(value * scale)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#8c959f" '
                     f'stroke-width="1"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11" '
                     f'fill="#57606a">{value:g}</text>')
    parts.append(f'<text x="{left + pw}" y="{height - 3}" text-anchor="end" font-size="11" fill="#57606a">'
                 f'elapsed ({"min" if in_minutes else "s"})</text>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#8c959f" '
                 f'stroke-width="1"/>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#8c959f" stroke-width="1"/>')
    # wedge spans first, under the lines
    for m in markers:
        if m.x_end is not None and m.x_end > m.x:
            x0, x1 = px(m.x), px(m.x_end)
            parts.append(f'<rect class="marker-span {esc(m.kind)}" x="{x0:.1f}" y="{top}" '
                         f'width="{max(1.0, x1 - x0):.1f}" height="{ph}" fill="{MARKER_COLORS.get(m.kind, "#888")}" '
                         f'fill-opacity="0.15"/>')
    # the series
    drawn = 0
    for s in series:
        d, pen_down, count = [], False, 0
        for x, y in decimate(s.points):
            if y is None or not math.isfinite(y):
                pen_down = False
                continue
            d.append(f"{'L' if pen_down else 'M'}{px(x):.1f} {py(y):.1f}")
            pen_down, count = True, count + 1
        if not d:
            continue
        drawn += count
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        # round caps: a lone reading between two gaps still shows as a dot
        parts.append(f'<path class="series" data-series="{esc(s.name)}" d="{" ".join(d)}" fill="none" '
                     f'stroke="{s.color}" stroke-width="{s.width:g}" stroke-linejoin="round" '
                     f'stroke-linecap="round"{dash}/>')
    if not drawn:
        parts.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph / 2:.1f}" text-anchor="middle" font-size="13" '
                     f'fill="#8c959f">no samples</text>')
    # markers on top, labels staggered so that close events stay readable
    for i, m in enumerate(markers):
        color = MARKER_COLORS.get(m.kind, "#888888")
        x = px(m.x)
        dash = ' stroke-dasharray="5 3"' if m.kind == "wedge" else ""
        label_y = top + 12 + (i % 3) * 13
        anchor, lx = ("end", x - 4) if x > left + pw * 0.7 else ("start", x + 4)
        parts.append(f'<g class="marker {esc(m.kind)}"><title>{esc(m.detail or m.label)}</title>'
                     f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="{color}" '
                     f'stroke-width="2"{dash}/>'
                     f'<text x="{lx:.1f}" y="{label_y}" text-anchor="{anchor}" font-size="11" font-weight="bold" '
                     f'fill="{color}" stroke="#ffffff" stroke-width="3" paint-order="stroke">{esc(m.label)}</text>'
                     f'</g>')
    # legend, when there is more than one line
    if len(series) > 1:
        lx = left + pw
        for s in reversed(series):
            text_w = 7 * len(s.name)
            parts.append(f'<text x="{lx:.0f}" y="16" text-anchor="end" font-size="11" fill="#57606a">'
                         f'{esc(s.name)}</text>')
            lx -= text_w + 4
            dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
            parts.append(f'<line x1="{lx - 16:.0f}" x2="{lx:.0f}" y1="12" y2="12" stroke="{s.color}" '
                         f'stroke-width="{s.width:g}"{dash}/>')
            lx -= 26
    parts.append("</svg>")
    return "".join(parts)


# =========================================================================== reading

@dataclass
class Soak:
    host: str
    instance: str
    run: str | None = None
    path: str | None = None  # the soak's directory, relative to the report dir
    verdict: dict | None = None
    samples: list = field(default_factory=list)  # progress lines of the soak itself
    notes: list = field(default_factory=list)  # what could not be read, said plainly

    @property
    def anchor(self) -> str:
        raw = f"soak-{self.host}-{self.instance}-{self.run or 'verdict'}"
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)


@dataclass
class Node:
    host: str
    status: str
    report: dict = field(default_factory=dict)  # rollout/<host>.json
    preflight: dict | None = None
    summary: dict | None = None  # the CLI summary's entry for the host
    soaks: list = field(default_factory=list)


def _read_json(path: Path, notes: list, what: str):
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            notes.append(f"{what} is larger than {MAX_FILE_BYTES // 2**20} MiB: not read")
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        notes.append(f"{what} is missing")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        notes.append(f"{what} could not be read: {' '.join(str(exc).split())[:200]}")
    return None


def read_progress(path: Path, notes: list, what: str) -> list[dict]:
    """The soak's sample lines (not its wait for readiness), in order; bad lines skipped."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            notes.append(f"{what} is larger than {MAX_FILE_BYTES // 2**20} MiB: not plotted")
            return []
        text = path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        notes.append(f"{what} is missing: no plots")
        return []
    except OSError as exc:
        notes.append(f"{what} could not be read: {exc}")
        return []
    samples, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(data, dict) or not _number(data.get("elapsed_s")):
            bad += 1
            continue
        if data.get("phase") == "waiting_ready":
            continue
        samples.append(data)
    if bad:
        notes.append(f"{what}: {bad} line(s) could not be read and were skipped")
    return samples


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _num(value) -> float | None:
    return float(value) if _number(value) else None


def _soak_dirs(report_dir: Path, host: str) -> list[Path]:
    base = report_dir / "rollout" / host / "soak"
    try:
        return sorted(p for p in base.iterdir() if p.is_dir())
    except OSError:
        return []


def read_soaks(report_dir: Path, host: str, report: dict) -> list[Soak]:
    """Every soak of a node: its fetched files, joined with the verdict its rollout report holds."""
    soak = report.get("soak") if isinstance(report.get("soak"), dict) else None
    instances = soak.get("instances") if soak and isinstance(soak.get("instances"), dict) else {}
    soaks, seen = [], set()
    for directory in _soak_dirs(report_dir, host):
        run, sep, instance = directory.name.partition("-")
        if not sep:  # not <run>-<instance>: show it under its own name
            run, instance = None, directory.name
        rel = str(directory.relative_to(report_dir))
        item = Soak(host=host, instance=instance, run=run, path=rel)
        item.samples = read_progress(directory / PROGRESS_FILE, item.notes, f"{rel}/{PROGRESS_FILE}")
        verdict = _read_json(directory / VERDICT_FILE, item.notes, f"{rel}/{VERDICT_FILE}")
        if verdict is not None and not isinstance(verdict, dict):
            item.notes.append(f"{rel}/{VERDICT_FILE} is not a JSON object")
            verdict = None
        item.verdict = verdict
        soaks.append(item)
    # The latest run of an instance is the one the rollout report's verdict belongs to.
    latest = {}
    for item in soaks:
        latest[item.instance] = item
    for name, item in latest.items():
        seen.add(name)
        if item.verdict is None and isinstance(instances.get(name), dict):
            item.verdict = instances[name]
            item.notes.append("verdict.json missing or unreadable: the verdict shown is the one in the rollout report")
    for name, verdict in instances.items():
        if name in seen:
            continue
        item = Soak(host=host, instance=str(name), verdict=verdict if isinstance(verdict, dict) else None)
        item.notes.append(f"the soak's files were not fetched to rollout/{host}/soak/: no plots")
        soaks.append(item)
    return soaks


# =========================================================================== deciding what to show

def _first_line(text) -> str:
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _release_text(release) -> str:
    if isinstance(release, dict):
        if release.get("vllm") and release.get("cudnn"):
            return (f"vllm {release['vllm']} + {release.get('cudnn_package') or 'cuDNN'} {release['cudnn']}")
        return " ".join(f"{k}={v}" for k, v in release.items())
    return "" if release is None else str(release)


def _preflight_verdict(entry) -> str | None:
    if not isinstance(entry, dict):
        return None
    report = entry.get("report")
    verdict = report.get("verdict") if isinstance(report, dict) else entry.get("verdict")
    return verdict if isinstance(verdict, str) else None


def _parse_time(value) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def _fmt_time(value) -> str:
    stamp = _parse_time(value)
    if stamp is None:
        return "" if value is None else str(value)
    return stamp.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt_duration(seconds) -> str:
    if not _number(seconds):
        return "—"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def collect_nodes(report_dir: Path, summary: dict | None) -> tuple[list[Node], dict, list[str]]:
    """(nodes in rollout order, preflight entries by host, problems)."""
    reports = read_reports(report_dir)
    problems = list(reports.problems)
    hosts_summary = (summary or {}).get("hosts") if isinstance((summary or {}).get("hosts"), dict) else {}
    command = (summary or {}).get("command")
    nodes = []
    for host, data in reports.rollout.items():
        status = data.get("status") if data.get("status") in STATUS_COLORS else "unknown"
        node = Node(host=host, status=status, report=data, preflight=reports.preflight.get(host),
                    summary=hosts_summary.get(host))
        try:
            node.soaks = read_soaks(report_dir, host, data)
        except Exception as exc:  # a report must never crash on odd input
            problems.append(f"soaks of {host} could not be read: {type(exc).__name__}: {exc}")
        nodes.append(node)
    nodes.sort(key=lambda n: (_parse_time(n.report.get("started")) or datetime.max.replace(tzinfo=timezone.utc)))
    known = {n.host for n in nodes}
    try:  # soak files fetched for a node whose own report never came
        fetched = sorted(p.name for p in (report_dir / "rollout").iterdir() if (p / "soak").is_dir())
    except OSError:
        fetched = []
    others = list(dict.fromkeys(list(reports.preflight) + list(hosts_summary) + fetched))
    for host in others:
        if host in known:
            continue
        pre = reports.preflight.get(host)
        ran = hosts_summary.get(host) or {}
        if _preflight_verdict(pre) == "block" or ran.get("status") == "blocked":
            status = "blocked"
        elif ran.get("status") in ("unreachable", "failed"):
            status = ran["status"]
        elif host in fetched:  # its turn began (a soak ran) but never wrote its report
            status = "unknown"
        elif command in (None, "rollout"):
            status = "not_reached"
        else:
            status = ran.get("status") or "unknown"
        node = Node(host=host, status=status if status in STATUS_COLORS else "unknown", preflight=pre, summary=ran)
        # a node whose turn never wrote its report may still have fetched soak files
        node.soaks = read_soaks(report_dir, host, {}) if (report_dir / "rollout" / host).is_dir() else []
        nodes.append(node)
    return nodes, reports.preflight, problems


def rollout_outcome(nodes: list[Node], summary: dict | None) -> tuple[str, str, str]:
    """(outcome key, one sentence, the reason behind it or "") for the page's header.

    converged: every node has its report and serves the target (upgraded or skipped);
    halted: a node failed its turn (rolled back, failed, unreachable) and the rest waited;
    blocked: preflight stopped the rollout before any node was touched;
    incomplete: anything else (an interrupted run, nodes without a report).
    """
    summary = summary or {}
    counts = Counter(n.status for n in nodes)
    command = summary.get("command")
    if command == "rollback":
        ok = summary.get("exit_code") == 0
        return ("rolled_back" if ok else "failed",
                summary.get("message") or ("rolled back" if ok else "the rollback failed"), "")
    if not nodes:
        return "empty", summary.get("message") or "No rollout or preflight report in this directory.", ""
    if counts["blocked"]:
        blocked = [n for n in nodes if n.status == "blocked"]
        why = _first_line(((blocked[0].preflight or {}).get("report") or {}).get("message")
                          if isinstance((blocked[0].preflight or {}).get("report"), dict) else "")
        return ("blocked", f"Preflight blocked the rollout on {', '.join(n.host for n in blocked)}: "
                           "no node was touched.", why or _first_line((blocked[0].summary or {}).get("message")))
    bad = [n for n in nodes if n.status in ("rolled_back", "failed", "unreachable")]
    if bad:
        first = bad[0]
        soak = first.report.get("soak") if isinstance(first.report.get("soak"), dict) else {}
        what = ("failed its soak gate" if soak.get("passed") is False
                else f"failed at '{first.report['failed_task']}'" if first.report.get("failed_task") else "failed")
        where = {"rolled_back": f"{first.host} {what} and was rolled back to "
                                f"{first.report.get('release') or 'its known-good release'}",
                 "failed": f"{first.host} {what}",
                 "unreachable": (f"{first.host} stopped answering after its drain and was kept out of traffic"
                                 if first.report else f"{first.host} could not be reached")}[first.status]
        rest = f"; {counts['not_reached']} node(s) after it were not touched" if counts["not_reached"] else ""
        return "halted", f"Halted: {where}{rest}.", _node_reason(first)
    reported = [n for n in nodes if n.report]
    if reported and all(n.status in ("upgraded", "skipped") for n in nodes) and summary.get("exit_code") in (0, None):
        target = _target(nodes)
        return "converged", (f"Every node serves {target}: {counts['upgraded']} upgraded, "
                             f"{counts['skipped']} already on it (skipped)."), ""
    return "incomplete", summary.get("message") or "The rollout did not reach every node.", ""


def _target(nodes: list[Node]) -> str:
    targets = Counter(str(n.report["target"]) for n in nodes if n.report.get("target"))
    if targets:
        return targets.most_common(1)[0][0]
    for n in nodes:
        if n.preflight and n.preflight.get("release"):
            return _release_text(n.preflight["release"])
    return "unknown"


def _soak_brief(verdict: dict | None) -> str:
    """'0 crashes in 50.0 min · 14,277 tokens/s · KV peak 43.8%'"""
    verdict = verdict or {}
    bits = []
    proof = verdict.get("proof") if isinstance(verdict.get("proof"), dict) else {}
    if _number(proof.get("minutes")) and _number(proof.get("crashes")):
        bits.append(f"{plural(proof['crashes'], 'crash', 'crashes')} in {proof['minutes']:.1f} min")
    if _number(verdict.get("tokens_per_s")):
        bits.append(f"{verdict['tokens_per_s']:,.0f} tokens/s")
    if _number(verdict.get("kv_cache_peak")):
        bits.append(f"KV peak {verdict['kv_cache_peak'] * 100:.1f}%")
    return " · ".join(bits) or "passed"


def _node_reason(node: Node) -> str:
    soak = node.report.get("soak") if isinstance(node.report.get("soak"), dict) else {}
    reasons = soak.get("reasons") if isinstance(soak.get("reasons"), list) else []
    if reasons:
        return str(reasons[0])
    return _first_line(node.report.get("message") or (node.summary or {}).get("message"))


# =========================================================================== HTML

CSS = """
*{box-sizing:border-box}
body{margin:0;padding:20px 24px 40px;font-family:"DejaVu Sans",Verdana,sans-serif;font-size:13px;color:#1f2328;
 background:#f6f8fa;line-height:1.4}
h1{font-size:21px;margin:0 0 6px} h2{font-size:16px;margin:22px 0 8px} h3{font-size:14px;margin:0 0 6px}
code,pre{font-family:"DejaVu Sans Mono",monospace;font-size:12px}
pre{white-space:pre-wrap;word-break:break-all;margin:4px 0;padding:6px 8px;background:#f6f8fa;border-radius:4px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 14px;margin:0 0 12px}
.badge{display:inline-block;padding:2px 9px;border-radius:11px;color:#fff;font-weight:bold;font-size:12px;
 white-space:nowrap;vertical-align:1px}
.badge.outline{background:#fff;color:#57606a;border:1px solid #8c959f}
.badge.big{font-size:15px;padding:3px 12px;border-radius:13px}
.meta{color:#57606a} .meta b{color:#1f2328}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;vertical-align:top;padding:6px 8px;border-bottom:1px solid #d8dee4}
th{font-size:12px;color:#57606a;background:#f6f8fa}
td.release code{word-break:break-all}
.note{color:#9a6700;background:#fff8c5;border:1px solid #d4a72c;border-radius:4px;padding:4px 8px;margin:4px 0}
.proof{background:#ddf4ff;border-left:4px solid #0969da;padding:6px 10px;margin:6px 0}
.reasons{margin:4px 0 6px;padding-left:18px;color:#82071e}
.plots{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:10px;margin:8px 0 4px}
.plots svg{display:block;width:100%;height:auto;border:1px solid #d8dee4;border-radius:4px}
td.host{white-space:nowrap}
.why-line{color:#82071e;margin-top:2px}
.stats span{margin-right:14px;white-space:nowrap}
.events{margin:6px 0 0}
.small{font-size:12px}
a{color:#0969da;text-decoration:none}
details>summary{cursor:pointer}
"""


def _badge(text: str, color: str | None, cls: str = "", title: str | None = None) -> str:
    tip = f' title="{esc(title)}"' if title else ""
    if color is None:
        return f'<span class="badge outline {cls}"{tip}>{esc(text)}</span>'
    return f'<span class="badge {cls}" style="background:{color}"{tip}>{esc(text)}</span>'


def _status_badge(status: str) -> str:
    return _badge(STATUS_LABELS.get(status, status), STATUS_COLORS.get(status), f"status status-{status}")


def _soak_badge(passed) -> str:
    if passed is True:
        return _badge("passed", VERDICT_COLORS["passed"], "soak soak-passed")
    if passed is False:
        return _badge("failed", VERDICT_COLORS["failed"], "soak soak-failed")
    return '<span class="meta">—</span>'


def _notes(notes) -> str:
    return "".join(f'<div class="note">{esc(n)}</div>' for n in notes)


def _header(nodes, summary, outcome, sentence, why, report_dir) -> str:
    summary = summary or {}
    command = summary.get("command") or "rollout"
    counts = Counter(n.status for n in nodes)
    order = ("upgraded", "skipped", "reverted", "rolled_back", "failed", "blocked", "unreachable", "not_reached", "unknown")
    count_text = " · ".join(f"<b>{counts[s]}</b> {esc(STATUS_LABELS.get(s, s))}" for s in order if counts[s])
    started = summary.get("started") or min((n.report.get("started") for n in nodes if n.report.get("started")),
                                            default=None, key=lambda v: str(v))
    finished = summary.get("finished") or max((n.report.get("finished") for n in nodes if n.report.get("finished")),
                                              default=None, key=lambda v: str(v))
    t0, t1 = _parse_time(started), _parse_time(finished)
    took = f" ({_fmt_duration((t1 - t0).total_seconds())})" if t0 and t1 else ""
    exit_text = ""
    if summary.get("exit_code") is not None:
        exit_text = (f'<div class="meta">vllm-fleet {esc(command)}: <b>{esc(summary.get("outcome"))}</b> '
                     f'(exit {esc(summary.get("exit_code"))}) — {esc(summary.get("message"))}</div>')
    badge = _badge(STATUS_LABELS.get(outcome, outcome).upper(), OUTCOME_COLORS.get(outcome),
                   f"big outcome outcome-{outcome}")
    return (f'<div class="card header"><h1>vLLM fleet {esc(command)} report</h1>'
            f'<div style="margin:6px 0 8px">{badge} '
            f'<span style="font-size:15px">{esc(sentence)}</span>'
            + (f'<div class="why-line">{esc(why)}</div>' if why else "") + "</div>"
            f'<div class="meta">target release <code><b>{esc(_target(nodes))}</b></code></div>'
            f'<div class="meta">started <b>{esc(_fmt_time(started)) or "—"}</b> · finished '
            f'<b>{esc(_fmt_time(finished)) or "—"}</b>{esc(took)}</div>'
            f'<div class="meta">{len(nodes)} node(s): {count_text or "none"}</div>{exit_text}'
            f'<div class="meta small">from {esc(report_dir)}</div></div>')


def _node_table(nodes: list[Node]) -> str:
    rows = []
    for n in nodes:
        r = n.report
        target, previous, release = r.get("target"), r.get("previous"), r.get("release")
        if n.status == "upgraded":
            rel = (f'<div><span class="meta">from</span> <code>{esc(previous or "(none)")}</code> →</div>'
                   f'<div><span class="meta">now</span> <code><b>{esc(release or target)}</b></code></div>')
        elif n.status == "skipped":
            rel = (f'<div><span class="meta">serves</span> <code><b>{esc(release or target)}</b></code></div>'
                   '<div class="meta">already its known-good release: left alone</div>')
        elif n.status == "rolled_back":
            rel = (f'<div><span class="meta">tried</span> <code><s>{esc(target)}</s></code></div>'
                   f'<div><span class="meta">back on</span> <code><b>{esc(release or previous or "(none)")}</b>'
                   "</code></div>")
        elif r:
            rel = f"<code>{esc(release or previous or target)}</code>"
        else:
            rel = '<span class="meta">untouched: still serves its release</span>'
        soak = r.get("soak") if isinstance(r.get("soak"), dict) else None
        links = " ".join(f'<a href="#{esc(s.anchor)}">{esc(s.instance)}</a>' for s in n.soaks)
        soak_cell = _soak_badge(soak.get("passed") if soak else None) + (f" <span class=\"small\">{links}</span>"
                                                                       if links else "")
        why = []
        if soak and isinstance(soak.get("reasons"), list):
            why += [f"<li>{esc(x)}</li>" for x in soak["reasons"][:3]]
        message = r.get("message") or (n.summary or {}).get("message")
        if message and not why:
            why.append(f"<li>{esc(_first_line(message))}</li>")
        if not r and n.soaks:
            why.append('<li class="meta">no rollout report: the node\'s turn did not finish (only its soak '
                       "files came back)</li>")
        if soak and soak.get("passed") is True:
            why += [f'<li class="meta">{esc(s.instance)}: {esc(_soak_brief(s.verdict))}</li>'
                    for s in n.soaks if s.verdict]
        if r.get("failed_task"):
            why.append(f'<li class="meta">failed task: {esc(r["failed_task"])}</li>')
        t0, t1 = _parse_time(r.get("started")), _parse_time(r.get("finished"))
        when = (f'{esc(_fmt_time(r.get("started"))[11:19])}<br><span class="meta">'
                f'{esc(_fmt_duration((t1 - t0).total_seconds()))}</span>' if t0 and t1 else "—")
        pre = _preflight_verdict(n.preflight)
        pre_cell = _badge(pre, VERDICT_COLORS.get(pre), "preflight") if pre in VERDICT_COLORS else esc(pre or "—")
        rows.append(f'<tr class="node" data-host="{esc(n.host)}" data-status="{esc(n.status)}">'
                    f'<td class="host"><b>{esc(n.host)}</b></td><td>{_status_badge(n.status)}</td><td>{pre_cell}</td>'
                    f'<td class="release">{rel}</td><td>{soak_cell}</td>'
                    f'<td><ul class="reasons">{"".join(why)}</ul></td><td>{when}</td></tr>')
    return ('<h2>Nodes, in rollout order</h2><div class="card" style="padding:0"><table class="nodes">'
            '<tr><th>node</th><th>status</th><th>preflight</th><th style="width:360px">release</th><th>soak</th>'
            '<th>details</th><th>started</th></tr>' + "".join(rows) + "</table></div>")


_DEVICES = re.compile(r" \[devices? [0-9, ]+\]")


def _preflight_section(preflight: dict) -> str:
    """One row per distinct finding set: a fleet of alike nodes reads as one line, not N."""
    if not preflight:
        return ""
    verdicts = Counter(_preflight_verdict(e) or "none" for e in preflight.values())
    groups: dict = {}
    for host, entry in preflight.items():
        verdict = _preflight_verdict(entry) or "no verdict"
        report = entry.get("report") if isinstance(entry.get("report"), dict) else {}
        gpu = entry.get("gpu") if isinstance(entry.get("gpu"), dict) else {}
        devices = gpu.get("devices") if isinstance(gpu.get("devices"), list) else []
        gpu_text = ", ".join(sorted({f"{d.get('name')} (cc {d.get('compute_capability')})" for d in devices
                                     if isinstance(d, dict)})) or str(gpu.get("reason") or "—")
        lines = report.get("summary") if isinstance(report.get("summary"), list) else []
        if not lines and entry.get("verdict"):  # the node failed before its preflight ran
            lines = [str(entry["verdict"])]
        key = (verdict, gpu_text, tuple(_DEVICES.sub("", str(x)) for x in lines))
        groups.setdefault(key, []).append((host, gpu_text))
    rows = []
    for (verdict, _, lines), members in groups.items():
        hosts = ", ".join(h for h, _ in members)
        gpus = [members[0][1]]
        head, rest = (lines[:1], lines[1:])
        important = [x for x in rest if x.startswith(("BLOCKER", "accepted"))]
        other = [x for x in rest if x not in important]
        more = (f'<details class="small"><summary>{len(other)} more finding(s)</summary>'
                + "<br>".join(esc(x) for x in other) + "</details>") if other else ""
        rows.append(f'<tr><td class="host"><b>{esc(hosts)}</b></td><td>'
                    f'{_badge(verdict, VERDICT_COLORS.get(verdict), "preflight")}</td><td>{esc("; ".join(gpus))}</td>'
                    f'<td>{"<br>".join(esc(x) for x in head)}'
                    + "".join(f'<div class="why-line">{esc(x)}</div>' for x in important) + more + "</td></tr>")
    attention = any(v not in ("pass", "warn") for v in verdicts)
    title = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
    return (f'<details class="preflight" open><summary><h2 style="display:inline">'
            f'Preflight</h2> <span class="meta">{esc(title)}</span></summary>'
            f'<div class="card" style="padding:0;margin-top:8px{";border-color:#6639ba" if attention else ""}">'
            '<table><tr><th>nodes</th><th>verdict</th><th>GPU</th><th>findings</th></tr>'
            + "".join(rows) + "</table></div></details>")


def soak_events(soak: Soak) -> list[Marker]:
    """Crash and wedge markers: from the verdict, else from the progress counters."""
    markers = []
    verdict = soak.verdict or {}
    crashes = verdict.get("crashes") if isinstance(verdict.get("crashes"), list) else None
    wedges = verdict.get("wedges") if isinstance(verdict.get("wedges"), list) else None
    for c in crashes or ():
        if isinstance(c, dict) and _number(c.get("elapsed_s")):
            markers.append(Marker(float(c["elapsed_s"]), "crash", f"crash {_fmt_duration(c['elapsed_s'])}",
                                  detail=f"crash ({c.get('kind')}): {c.get('evidence') or ''}"))
    for w in wedges or ():
        if isinstance(w, dict) and _number(w.get("elapsed_s")):
            since = _num(w.get("since_elapsed_s"))
            start = since if since is not None else float(w["elapsed_s"])
            markers.append(Marker(start, "wedge", f"wedge {_fmt_duration(start)}", x_end=float(w["elapsed_s"]),
                                  detail=f"wedge ({w.get('kind')}): {w.get('evidence') or ''}"))
    # Without a verdict, the progress lines still count them.
    for key, kind, have in (("crashes", "crash", crashes), ("wedges", "wedge", wedges)):
        if have is not None:
            continue
        before = 0
        for line in soak.samples:
            count = line.get(key)
            if _number(count) and count > before:
                markers.append(Marker(float(line["elapsed_s"]), kind, f"{kind} {_fmt_duration(line['elapsed_s'])}",
                                      detail=f"{kind} counted in progress.jsonl"))
                before = count
    return sorted(markers, key=lambda m: m.x)


def soak_plots(soak: Soak) -> str:
    samples = soak.samples
    markers = soak_events(soak)
    verdict = soak.verdict or {}
    ends = [float(s["elapsed_s"]) for s in samples] + [m.x_end or m.x for m in markers]
    if _number(verdict.get("duration_s")):
        ends.append(float(verdict["duration_s"]))
    end = max(ends + [1.0])

    def points(key, scale=1.0):
        return [(float(s["elapsed_s"]), _num(s.get(key)) * scale if _num(s.get(key)) is not None else None)
                for s in samples]

    kv_points = points("kv_usage", 100.0)
    base = soak.anchor
    plots = [
        line_plot("tokens/s (prompt + generated)", [Series("tokens/s", PLOT_COLORS["tokens"], points("tokens_per_s"))],
                  x_max=end, markers=markers, plot_id=f"{base}-tokens"),
        line_plot("KV cache usage", [Series("KV cache", PLOT_COLORS["kv"], kv_points)], x_max=end, y_max=100.0,
                  y_format=lambda v: f"{v:g}%", markers=markers, plot_id=f"{base}-kv"),
        line_plot("requests", [Series("running", PLOT_COLORS["running"], points("running")),
                               Series("waiting", PLOT_COLORS["waiting"], points("waiting"), dash="4 3", width=1.5)],
                  x_max=end, markers=markers, plot_id=f"{base}-running"),
    ]
    return '<div class="plots">' + "".join(plots) + "</div>"


def _perf_table(verdict: dict) -> str:
    perf = verdict.get("performance") if isinstance(verdict.get("performance"), dict) else {}
    metrics = perf.get("metrics") if isinstance(perf.get("metrics"), dict) else {}
    rows = []
    for key, m in metrics.items():
        if not isinstance(m, dict):
            continue
        passed = m.get("passed")
        mark = {True: "✓", False: "✗"}.get(passed, "not measured")
        change = m.get("change")
        change_text = f" ({change * 100:+.1f}%)" if _number(change) and key != "kv_cache_peak" else (
            f" ({change * 100:+.1f} points)" if _number(change) else "")
        fmt = (lambda v: f"{v * 100:.1f}%") if key == "kv_cache_peak" else (lambda v: f"{v:,.4g}")
        obs = fmt(m["observed"]) if _number(m.get("observed")) else "—"
        base = fmt(m["baseline"]) if _number(m.get("baseline")) else "—"
        limit = fmt(m["limit"]) if _number(m.get("limit")) else "—"
        rows.append(f"<tr><td>{esc(key)}</td><td>{esc(obs)}{esc(change_text)}</td><td>{esc(base)}</td>"
                    f"<td>{esc(m.get('direction'))} {esc(limit)}</td><td>{esc(mark)}</td></tr>")
    if not rows:
        return ""
    return ('<details class="small"><summary>performance against the baseline</summary><table class="perf">'
            "<tr><th>metric</th><th>observed</th><th>baseline</th><th>limit</th><th></th></tr>"
            + "".join(rows) + "</table></details>")


def _soak_section(soak: Soak) -> str:
    verdict = soak.verdict or {}
    passed = verdict.get("passed") if isinstance(verdict.get("passed"), bool) else None
    ran = verdict.get("duration_s")
    planned = verdict.get("planned_duration_s")
    if not _number(planned) and soak.samples:
        planned = soak.samples[-1].get("duration_s")
    if not _number(ran) and soak.samples:
        ran = soak.samples[-1].get("elapsed_s")
    stopped = verdict.get("stopped")
    run_text = f"ran {_fmt_duration(ran)}" + (f" of {_fmt_duration(planned)} planned" if _number(planned) else "")
    if stopped and stopped != "completed":
        run_text += f" — stopped: {stopped}"
    head = (f'<h3>{esc(soak.host)} · {esc(soak.instance)} {_soak_badge(passed)} '
            f'<span class="meta small">{esc(run_text)}'
            f'{" · run " + esc(soak.run) if soak.run else ""}</span></h3>')
    parts = [f'<div class="card soak" id="{esc(soak.anchor)}" data-host="{esc(soak.host)}" '
             f'data-instance="{esc(soak.instance)}">', head]
    if verdict.get("summary") and passed is not True:  # a pass is said by the badge and the proof
        parts.append(f'<div class="summary"><b>{esc(verdict["summary"])}</b></div>')
    reasons = verdict.get("reasons") if isinstance(verdict.get("reasons"), list) else []
    if len(reasons) > 1 or (reasons and reasons[0] not in str(verdict.get("summary"))):
        parts.append('<ul class="reasons">' + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>")
    proof = verdict.get("proof") if isinstance(verdict.get("proof"), dict) else {}
    proved = [x for x in (proof.get("not_proved"), proof.get("statement"), proof.get("target_statement")) if x]
    if proved:
        parts.append('<div class="proof"><b>What it proved:</b> ' + " ".join(esc(x) for x in proved) + "</div>")
    stats = []
    tps = verdict.get("tokens_per_s")
    if _number(tps):
        # Both figures when the bench reported its own, and which one the gate judged.
        throughput = verdict.get("throughput") if isinstance(verdict.get("throughput"), dict) else {}
        reported = verdict.get("bench_tokens_per_s")
        used = {"bench_totals": "recomputed from the runs' token totals",
                "server_metrics": "the server's own count"}.get(throughput.get("gate_used"))
        text = f"<b>{tps:,.0f}</b> tokens/s" + (f" ({esc(used)}, judged by the gate)" if used else "")
        if _number(reported):
            text += f"; the bench reported <b>{reported:,.0f}</b> tokens/s"
        stats.append(text)
    if _number(verdict.get("kv_cache_peak")):
        stats.append(f"KV cache peak <b>{verdict['kv_cache_peak'] * 100:.1f}%</b>")
    for key, word, words in (("crashes", "crash", "crashes"), ("wedges", "wedge", "wedges")):
        if isinstance(verdict.get(key), list):
            n = len(verdict[key])
            stats.append(f"<b>{n}</b> {word if n == 1 else words}")
    if _number(verdict.get("failed_requests")):
        n = verdict["failed_requests"]
        stats.append(f"<b>{n:g}</b> failed request{'' if n == 1 else 's'}")
    load = verdict.get("load") if isinstance(verdict.get("load"), dict) else {}
    shape = load.get("shape") if isinstance(load.get("shape"), dict) else {}
    if shape:
        runs = plural(load["runs"] if _number(load.get("runs")) else 0, "load run")
        stats.append(f"load {esc(shape.get('concurrency'))} clients × {esc(shape.get('input_len'))} tokens in / "
                     f"{esc(shape.get('output_len'))} out, {esc(runs)} finished")
    stats.append(plural(len(soak.samples), "sample"))
    parts.append('<div class="stats meta">' + "".join(f"<span>{s}</span>" for s in stats) + "</div>")
    try:
        parts.append(soak_plots(soak))
    except Exception as exc:
        parts.append(_notes([f"the plots could not be drawn: {type(exc).__name__}: {exc}"]))
    events = []
    for c in verdict.get("crashes") if isinstance(verdict.get("crashes"), list) else []:
        if not isinstance(c, dict):
            continue
        latency = (f", detected {c['detection_latency_s']:g} s after the engine logged it"
                   if _number(c.get("detection_latency_s")) else "")
        recovered = (f"; healthy again at {c['recovered_elapsed_s']:g} s" if _number(c.get("recovered_elapsed_s"))
                     else "")
        journal = c.get("journal") if isinstance(c.get("journal"), list) else []
        events.append(f'<div class="event crash"><b style="color:{MARKER_COLORS["crash"]}">crash</b> at '
                      f'{esc(_fmt_duration(c.get("elapsed_s")))} ({esc(c.get("kind"))}{esc(latency)}{esc(recovered)})'
                      + (f"<pre>{esc(chr(10).join(str(x) for x in journal[:6]))}</pre>" if journal
                         else f"<pre>{esc(c.get('evidence'))}</pre>") + "</div>")
    for w in verdict.get("wedges") if isinstance(verdict.get("wedges"), list) else []:
        if isinstance(w, dict):
            events.append(f'<div class="event wedge"><b style="color:{MARKER_COLORS["wedge"]}">wedge</b> from '
                          f'{esc(_fmt_duration(w.get("since_elapsed_s")))}, detected at '
                          f'{esc(_fmt_duration(w.get("elapsed_s")))} ({esc(w.get("kind"))})'
                          f'<pre>{esc(w.get("evidence"))}</pre></div>')
    if events:
        parts.append('<div class="events">' + "".join(events) + "</div>")
    parts.append(_perf_table(verdict))
    notes = verdict.get("notes") if isinstance(verdict.get("notes"), list) else []
    notes = [x for x in notes if x not in proved]
    if notes:
        parts.append('<div class="meta small">' + " ".join(esc(n) for n in notes) + "</div>")
    if soak.verdict is None:
        soak.notes.append("no verdict for this soak (it may still have been running, or its files were lost)")
    parts.append(_notes(soak.notes))
    parts.append("</div>")
    return "".join(parts)


def render(report_dir: Path, summary: dict | None = None) -> str:
    """The page, as a string (``build_report`` writes it)."""
    report_dir = Path(report_dir)
    body, problems = [], []
    try:
        nodes, preflight, problems = collect_nodes(report_dir, summary)
    except Exception as exc:
        nodes, preflight = [], {}
        problems.append(f"the reports could not be read: {type(exc).__name__}: {exc}")
    if not report_dir.is_dir():
        problems.append(f"{report_dir} is not a directory")
    problems += [str(p) for p in (summary or {}).get("problems") or [] if str(p) not in problems]
    outcome, sentence, why = rollout_outcome(nodes, summary)
    sections = [
        ("header", lambda: _header(nodes, summary, outcome, sentence, why, report_dir)),
        ("problems", lambda: _notes(problems)),
        ("nodes", lambda: _node_table(nodes) if nodes else ""),
        ("preflight", lambda: _preflight_section(preflight)),
    ]
    for name, make in sections:
        try:
            body.append(make())
        except Exception as exc:
            body.append(_notes([f"the {name} section could not be drawn: {type(exc).__name__}: {exc}"]))
    soaks = [s for n in nodes for s in n.soaks]
    if soaks:
        body.append("<h2>Soaks</h2>")
    for soak in soaks:
        try:
            body.append(_soak_section(soak))
        except Exception as exc:
            body.append(_notes([f"the soak {soak.path or soak.instance} of {soak.host} could not be drawn: "
                                f"{type(exc).__name__}: {exc}"]))
            body.append(f"<!-- {esc(traceback.format_exc(limit=3))} -->")
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    body.append(f'<div class="meta small">generated {generated} by vllm-fleet from the files under '
                f'{esc(report_dir)}</div>')
    title = f"vllm-fleet {(summary or {}).get('command') or 'rollout'}: {outcome} — {_target(nodes)}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f'<body data-outcome="{esc(outcome)}">' + "\n".join(body) + "</body></html>\n")


def build_report(report_dir: Path, output: Path | None = None, summary: dict | None = None) -> Path:
    """Write the run's HTML report (default ``<report_dir>/rollout.html``) and return its path.

    ``summary`` is the CLI's JSON summary of the run, when there is one: it adds the exit
    code and message and the hosts that have no report of their own (not reached).
    """
    report_dir = Path(report_dir)
    output = Path(output) if output is not None else report_dir / REPORT_FILE
    text = render(report_dir, summary)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, output)
    return output
