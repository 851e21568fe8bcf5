"""JUnit XML for CI: one testsuite per command, one testcase per host.

Follows the common (Jenkins/Ant) JUnit schema: testsuites > testsuite(name, tests,
failures, errors, skipped, time, timestamp) > properties, testcase(name, classname,
time) with at most one of failure/error/skipped (message, type, text), system-out.
A failed, blocked or rolled-back host is a failure; an unreachable host is an error; a
host the run skipped, or had no result for (an interrupted run), is skipped. A run that
failed with no host to blame (a usage error, a playbook that did not parse) gets one
testcase of its own, so CI never shows it green.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from .events import clean

FAILURE_STATUSES = ("failed", "blocked", "rolled_back")
ERROR_STATUSES = ("unreachable",)
SKIPPED_STATUSES = ("skipped", "unknown")
# XML 1.0 cannot carry these at all, escaped or not; clean() writes out the controls and lone
# surrogates (ansible output can hold them), and these two are written out here.
_NONCHARACTERS = re.compile("[\ufffe\uffff]")


def xml_text(value) -> str:
    """Any text as XML 1.0 can carry it: what it cannot is written out (\\x1b, \\udc80)."""
    text = clean("" if value is None else str(value))
    return _NONCHARACTERS.sub(lambda m: "\\u%04x" % ord(m.group()), text)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""


def _timestamp(iso: str | None) -> str:
    """The schema's timestamp: ISO 8601 without a zone (UTC here)."""
    try:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%dT%H:%M:%S")
    except (TypeError, ValueError):
        return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _release_text(release) -> str:
    if isinstance(release, dict):
        return " ".join(f"{k}={v}" for k, v in release.items())
    return "" if release is None else str(release)


def build(summary: dict) -> ET.ElementTree:
    command = summary.get("command") or "run"
    classname = f"vllm-fleet.{command}"
    suite_name = f"vllm-fleet {command}"
    cases = []
    for host, info in (summary.get("hosts") or {}).items():
        case = ET.Element("testcase", name=xml_text(host), classname=classname,
                          time=f"{float(info.get('duration_s') or 0):.3f}")
        status = info.get("status")
        message = xml_text(info.get("message") or f"{host}: {status}")
        if status in FAILURE_STATUSES:
            el = ET.SubElement(case, "failure", message=_first_line(message), type=xml_text(status))
            el.text = message
        elif status in ERROR_STATUSES:
            el = ET.SubElement(case, "error", message=_first_line(message), type=xml_text(status))
            el.text = message
        elif status in SKIPPED_STATUSES:
            ET.SubElement(case, "skipped", message=xml_text(f"{host}: skipped" if status == "skipped"
                          else f"{host}: no result (the run ended before Ansible reported on it)"))
        out = ET.SubElement(case, "system-out")
        facts = {"status": status, "preflight": info.get("preflight_verdict"), "soak": info.get("soak_verdict"),
                 "release": _release_text(info.get("release")) or None}
        out.text = xml_text(" ".join(f"{k}={v}" for k, v in facts.items() if v)
                            + (f"\nfailed task: {info['failed_task']}" if info.get("failed_task") else ""))
        cases.append(case)
    blamed = any(c.find("failure") is not None or c.find("error") is not None for c in cases)
    if summary.get("exit_code", 0) != 0 and not blamed:
        case = ET.Element("testcase", name=xml_text(summary.get("outcome") or "run"), classname=classname,
                          time=f"{float(summary.get('duration_s') or 0):.3f}")
        tag = "error" if summary.get("outcome") == "usage_error" else "failure"
        message = xml_text(summary.get("message") or summary.get("outcome"))
        el = ET.SubElement(case, tag, message=_first_line(message), type=xml_text(summary.get("outcome")))
        el.text = message
        cases.append(case)

    counts = {
        "tests": len(cases),
        "failures": sum(c.find("failure") is not None for c in cases),
        "errors": sum(c.find("error") is not None for c in cases),
        "skipped": sum(c.find("skipped") is not None for c in cases),
    }
    duration = f"{float(summary.get('duration_s') or 0):.3f}"
    root = ET.Element("testsuites", name="vllm-fleet", time=duration, **{k: str(v) for k, v in counts.items()})
    suite = ET.SubElement(root, "testsuite", name=suite_name, **{k: str(v) for k, v in counts.items()},
                          time=duration, timestamp=_timestamp(summary.get("started")))
    props = ET.SubElement(suite, "properties")
    for key in ("command", "playbook", "outcome", "exit_code", "limit", "artifacts"):
        if summary.get(key) is not None:
            ET.SubElement(props, "property", name=key, value=xml_text(summary[key]))
    suite.extend(cases)
    ET.indent(root)
    return ET.ElementTree(root)


def write(summary: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    build(summary).write(path, encoding="utf-8", xml_declaration=True)
    return path
