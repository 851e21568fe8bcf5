"""From what a run observed (runner events, the playbooks' own reports) to one outcome,
one exit code, and one status per host. Pure functions: unit-tested on recorded data.

Reports the playbooks write under the run's report dir (``vllm_fleet_report_dir``):
  preflight.json          {host: {host, gpu, cudnn_current, release, profile,
                                  report: {verdict: pass|warn|block, blockers, warnings,
                                           summary, message?}}}
  rollout/<host>.json     {host, status: upgraded|skipped|reverted|rolled_back|failed|unreachable,
                           release, soak: {passed, reasons, ...} | null, lb_state}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from .events import RunFacts


class ExitCode(IntEnum):
    SUCCESS = 0
    FAILED = 1
    USAGE = 2
    PREFLIGHT_BLOCKED = 3
    GATE_FAILED = 4
    UNREACHABLE = 5


OUTCOMES = {
    ExitCode.SUCCESS: "success",
    ExitCode.FAILED: "failed",
    ExitCode.USAGE: "usage_error",
    ExitCode.PREFLIGHT_BLOCKED: "preflight_blocked",
    ExitCode.GATE_FAILED: "gate_failed",
    ExitCode.UNREACHABLE: "unreachable",
}

# When several apply, the first wins. The exit code is what CI automates on, and 5 is the
# one code where "retry later" can be right: it must never hide a finding that a retry
# would not fix (a preflight block) or would repeat on a live node (a failed gate). A
# failed gate is evidence from a real node under load, so it outranks the static block.
PRECEDENCE = (ExitCode.USAGE, ExitCode.GATE_FAILED, ExitCode.PREFLIGHT_BLOCKED,
              ExitCode.UNREACHABLE, ExitCode.FAILED)

EXIT_CODE_HELP = """\
exit codes:
  0  success: every host ok (a preflight "warn" is a success)
  1  any other failure: a task failed, the run broke or was interrupted
  2  usage error: bad option or --extra-vars, missing inventory or playbook,
     a --limit that matches no host
  3  preflight blocked: a host's plan hits an unaccepted blocker (or it has no GPU)
  4  a gate failed: a host failed its soak during a rollout (and was rolled back)
  5  unreachable: Ansible could not reach a host
  When several apply: 2, then 4, then 3, then 5, then 1. The JSON summary lists them all."""

NO_HOSTS_MARKERS = ("leaves us with no hosts to target", "Could not match supplied host pattern")
# reverted: playbooks/rollback.yml took the node back on purpose (a success);
# rolled_back: a rollout's turn failed and its rescue took the node back;
# unreachable: the node stopped answering after its drain, its rescue kept it out of traffic.
ROLLOUT_STATUSES = ("upgraded", "skipped", "reverted", "rolled_back", "failed", "unreachable")


@dataclass
class Reports:
    preflight: dict = field(default_factory=dict)  # host -> entry of preflight.json
    rollout: dict = field(default_factory=dict)  # host -> rollout/<host>.json
    files: list[str] = field(default_factory=list)  # every report file, relative to the dir
    problems: list[str] = field(default_factory=list)  # unreadable reports, said plainly


def _load_json(path: Path, reports: Reports):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reports.problems.append(f"unreadable report {path.name}: {' '.join(str(exc).split())[:200]}")
        return None


def read_reports(report_dir: Path | None) -> Reports:
    reports = Reports()
    if report_dir is None or not Path(report_dir).is_dir():
        return reports
    report_dir = Path(report_dir)
    reports.files = sorted(str(p.relative_to(report_dir)) for p in report_dir.rglob("*") if p.is_file())
    preflight = report_dir / "preflight.json"
    if preflight.is_file():
        data = _load_json(preflight, reports)
        if isinstance(data, dict):
            reports.preflight = {h: e for h, e in data.items() if isinstance(e, dict)}
        elif data is not None:
            reports.problems.append("preflight.json is not a mapping of hosts")
    for path in sorted((report_dir / "rollout").glob("*.json")):
        data = _load_json(path, reports)
        if not isinstance(data, dict):
            if data is not None:
                reports.problems.append(f"rollout/{path.name} is not a mapping")
            continue
        reports.rollout[str(data.get("host") or path.stem)] = data
    return reports


def preflight_verdict(entry: dict | None) -> str | None:
    report = (entry or {}).get("report")
    verdict = report.get("verdict") if isinstance(report, dict) else None
    return verdict if isinstance(verdict, str) else None


def soak_verdict(entry: dict | None) -> str | None:
    soak = (entry or {}).get("soak")
    if not isinstance(soak, dict) or "passed" not in soak:
        return None
    return "passed" if soak["passed"] is True else "failed"


def gate_failed(entry: dict | None) -> bool:
    """The node's soak gate failed (and the rollout rolled it back). A node rolled back for
    another reason (a drain, a cutover, a readiness wait) is a plain failure: exit 4 must
    mean "the release failed under load", never an infrastructure hiccup."""
    return soak_verdict(entry) == "failed"


def host_status(host: str, facts: RunFacts, reports: Reports) -> str:
    rollout = reports.rollout.get(host) or {}
    # A node lost in its turn: its rescue's probe was an ignored unreachable, not "dark".
    if facts.stat("dark", host) or rollout.get("status") == "unreachable":
        return "unreachable"
    if preflight_verdict(reports.preflight.get(host)) == "block":
        return "blocked"
    if rollout.get("status") in ("rolled_back", "failed"):
        return rollout["status"]
    if facts.stat("failures", host):
        return "failed"
    if rollout.get("status") in ("upgraded", "skipped", "reverted"):
        return rollout["status"]
    if facts.stat("changed", host):
        return "changed"
    if facts.stat("ok", host):
        return "ok"
    if facts.stat("skipped", host):
        return "skipped"
    if facts.stats is None:  # the run ended (interrupted, broke) before Ansible's recap
        return "unknown"
    return "ok" if facts.stat("processed", host) else "skipped"


def _joined(value) -> str | None:
    if value in (None, "", []):
        return None
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def host_message(host: str, status: str, facts: RunFacts, reports: Reports) -> str | None:
    hf = facts.hosts.get(host)
    if status == "unreachable":
        return _joined((reports.rollout.get(host) or {}).get("message")) or (hf.unreachable_message if hf else None)
    if status == "blocked":
        report = (reports.preflight.get(host) or {}).get("report") or {}
        return _joined(report.get("message")) or _joined(report.get("summary")) or (hf and hf.failed_message)
    if status in ("rolled_back", "failed"):
        rollout = reports.rollout.get(host) or {}
        soak = rollout.get("soak") if isinstance(rollout.get("soak"), dict) else {}
        reasons = soak.get("reasons")
        if isinstance(reasons, list) and reasons:
            reasons = "; ".join(str(r) for r in reasons)
        return _joined(rollout.get("message")) or _joined(reasons) or (hf and hf.failed_message)
    return None


def host_failed_task(host: str, status: str, facts: RunFacts, reports: Reports) -> str | None:
    hf = facts.hosts.get(host)
    if status in ("rolled_back", "failed", "unreachable"):
        reported = (reports.rollout.get(host) or {}).get("failed_task")
        if reported:  # the task that failed inside the node's turn, before its rescue ran
            return str(reported)
    if status == "unreachable":
        return hf.unreachable_task if hf else None
    if status in ("failed", "blocked", "rolled_back"):
        return hf.failed_task if hf else None
    return None


def host_release(host: str, reports: Reports):
    rollout = reports.rollout.get(host) or {}
    if rollout.get("release") is not None:
        return rollout["release"]
    return (reports.preflight.get(host) or {}).get("release")


def _host_names(facts: RunFacts, reports: Reports) -> list[str]:
    names = list(facts.hosts)
    for key in ("processed", "dark", "failures", "ok", "changed", "skipped"):
        names += list(((facts.stats or {}).get(key) or {}))
    names += list(reports.rollout) + list(reports.preflight)
    return list(dict.fromkeys(names))


@dataclass
class Decision:
    exit_code: ExitCode
    outcomes: list[str]  # every outcome that applied, most important first
    hosts: dict[str, dict]
    message: str


def _names(hosts: dict, statuses: tuple[str, ...]) -> list[str]:
    return [h for h, v in hosts.items() if v["status"] in statuses]


def decide(facts: RunFacts, reports: Reports, rc: int | None, status: str | None,
           limit: str | None = None) -> Decision:
    hosts = {}
    for host in _host_names(facts, reports):
        st = host_status(host, facts, reports)
        hf = facts.hosts.get(host)
        hosts[host] = {
            "status": st,
            "release": host_release(host, reports),
            "preflight_verdict": preflight_verdict(reports.preflight.get(host)),
            "soak_verdict": soak_verdict(reports.rollout.get(host)),
            "failed_task": host_failed_task(host, st, facts, reports),
            "message": host_message(host, st, facts, reports),
            "duration_s": round(hf.duration_s, 3) if hf else 0.0,
        }
    found: dict[ExitCode, str] = {}
    output = "\n".join(facts.output)
    if facts.stats is None and rc not in (0, None):  # ansible-playbook stopped before any play
        if any(marker in output for marker in NO_HOSTS_MARKERS):
            found[ExitCode.USAGE] = (f"--limit {limit!r} matches no host in the inventory" if limit
                                     else "the inventory has no host for this playbook")
        elif rc == 5:  # ansible-playbook: bad or incomplete options
            found[ExitCode.USAGE] = _error_text(facts) or "ansible-playbook rejected its options"
    gate = [h for h in hosts if gate_failed(reports.rollout.get(h))]
    if gate:
        found[ExitCode.GATE_FAILED] = f"gate failed, rolled back: {', '.join(gate)}"
    blocked = _names(hosts, ("blocked",))
    if blocked:
        found[ExitCode.PREFLIGHT_BLOCKED] = f"preflight blocked: {', '.join(blocked)}"
    dark = _names(hosts, ("unreachable",))
    if dark:
        found[ExitCode.UNREACHABLE] = f"unreachable: {', '.join(dark)}"
    failures = []
    for what, statuses in (("failed", ("failed",)), ("rolled back", ("rolled_back",))):
        names = [h for h in _names(hosts, statuses) if h not in gate]
        if names:
            failures.append(f"{what}: {', '.join(names)}")
    if status in ("canceled", "timeout"):
        failures.append("the run was interrupted" if status == "canceled" else "the run timed out")
    if not failures and not found and (rc not in (0, None) or status not in ("successful", None)):
        failures.append(_error_text(facts) or f"ansible-playbook exited {rc}")
    failures += reports.problems  # a report that cannot be read is never a success
    if failures:
        found[ExitCode.FAILED] = "; ".join(failures)
    if not found:
        return Decision(ExitCode.SUCCESS, [OUTCOMES[ExitCode.SUCCESS]], hosts,
                        f"success on {len(hosts)} host(s)" if hosts else "success (no host was targeted)")
    ordered = [code for code in PRECEDENCE if code in found]
    return Decision(ordered[0], [OUTCOMES[c] for c in ordered], hosts, "; ".join(found[c] for c in ordered))


def _error_text(facts: RunFacts) -> str | None:
    errors = [line for line in facts.output if "ERROR" in line]
    return " ".join(errors)[:500] if errors else None
