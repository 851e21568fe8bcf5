"""vllm-fleet: run the fleet's playbooks from CI, one command per playbook.

    vllm-fleet preflight [-i INVENTORY] [-l LIMIT] [-e VARS]...
    vllm-fleet rollout   ...
    vllm-fleet rollback  ...
    vllm-fleet coredumps {enable,disable,collect} ...
    vllm-fleet verify    ...
    vllm-fleet report    ARTIFACTS_DIR [-o HTML]

Each run streams one line per event that matters, keeps the ansible-runner artifacts
(and the playbooks' own reports) in one directory, and writes a JSON summary and JUnit
XML there (and where --json / --junit say). The exit code tells the outcome apart.
A rollout or rollback also writes rollout.html there: the per-node verdicts and each
soak's plots (`report` rebuilds it from an artifacts dir).
"""
from __future__ import annotations

import argparse
import configparser
import json
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn, TextIO

from . import __version__, junit
from . import report as html_report
from .events import clean, collect, terminal_text
from .extravars import ExtraVarsError, parse_extra_vars, vault_files
from .outcome import EXIT_CODE_HELP, OUTCOMES, Decision, ExitCode, decide, read_reports
from .progress import ProgressFormatter

# command -> (playbook relative to the project, help)
COMMANDS = {
    "preflight": ("playbooks/preflight.yml", "judge every node's plan against the known-issues catalogue (read-only)"),
    "rollout": ("rollout.yml", "roll the release out: canary first, then batches, each gated by a soak"),
    "rollback": ("playbooks/rollback.yml", "flip nodes back to their previous release"),
    "coredumps": ("playbooks/coredump.yml", "enable, disable or collect GPU core dumps"),
    "verify": ("playbooks/verify.yml", "re-hash the installed releases against their manifests and report drift"),
}
COREDUMP_ACTIONS = ("enable", "disable", "collect")
# The commands whose runs get the HTML report (<artifacts>/rollout.html).
HTML_REPORT_COMMANDS = ("rollout", "rollback")
REPORT_DIR_VAR = "vllm_fleet_report_dir"
COREDUMP_ACTION_VAR = "vllm_fleet_coredump_action"


class UsageError(Exception):
    """Bad input from the user: exit 2 with one clear line, no traceback."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def default_project_dir() -> Path:
    """The checkout this package lives in (an editable install), else the current dir."""
    here = Path(__file__).resolve().parents[2]
    if (here / "ansible.cfg").is_file() and (here / "playbooks").is_dir():
        return here
    return Path.cwd()


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    opts = common.add_argument_group("run options")
    opts.add_argument("-i", "--inventory", action="append", metavar="PATH",
                      help="inventory file or directory (repeatable); default: the project's ansible.cfg inventory")
    opts.add_argument("-l", "--limit", metavar="PATTERN", help="limit the run to these hosts/groups, as in Ansible")
    opts.add_argument("-e", "--extra-vars", action="append", metavar="VARS", default=[],
                      help="extra variables as key=value, inline JSON/YAML, or @file (repeatable; of these a later "
                           "value wins). A vaulted @file goes to ansible-playbook before all of them, wherever it "
                           "is given: a plain value wins over it")
    opts.add_argument("--vault-id", action="append", metavar="ID", default=[],
                      help="a vault identity for ansible-playbook (label@source; repeatable)")
    opts.add_argument("--vault-password-file", action="append", metavar="PATH", type=Path, default=[],
                      help="a vault password file for ansible-playbook (repeatable)")
    opts.add_argument("--check", action="store_true", help="run Ansible in check mode (a dry run)")
    opts.add_argument("--artifacts", metavar="DIR", type=Path,
                      help="directory for this run's artifacts (new or empty); "
                           "default: <project>/reports/runs/<timestamp>-<command>")
    opts.add_argument("--json", metavar="PATH", type=Path, dest="json_path",
                      help="also write the JSON summary here (always in the artifacts as summary.json)")
    opts.add_argument("--junit", metavar="PATH", type=Path, dest="junit_path",
                      help="also write the JUnit XML here (always in the artifacts as junit.xml)")
    opts.add_argument("-q", "--quiet", action="store_true", help="no progress lines, only the result")
    opts.add_argument("-v", "--verbose", action="store_true", help="progress lines for ok and skipped tasks too")
    opts.add_argument("--project-dir", metavar="DIR", type=Path,
                      help="the vllm-fleet checkout holding ansible.cfg and the playbooks (default: %(default)s)",
                      default=default_project_dir())

    parser = _Parser(prog="vllm-fleet", description=__doc__.split("\n\n")[0],
                     epilog=EXIT_CODE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name, (playbook, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, parents=[common], help=help_text,
                             description=f"{help_text}. Runs {playbook}.",
                             epilog=EXIT_CODE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == "coredumps":
            cmd.add_argument("action", choices=COREDUMP_ACTIONS,
                             help=f"passed to the playbook as {COREDUMP_ACTION_VAR}")
    rep = sub.add_parser("report", help="(re)build the HTML report of a run from its artifacts dir",
                         description="Write rollout.html (per-node verdicts, each soak's plots) from the files of "
                                     "a run: an artifacts dir (with reports/ and summary.json) or a report dir.")
    rep.add_argument("dir", type=Path, metavar="DIR", help="the run's artifacts dir, or its reports/ dir")
    rep.add_argument("-o", "--output", type=Path, metavar="HTML",
                     help=f"where to write the page (default: DIR/{html_report.REPORT_FILE})")
    return parser


def _prescan_outputs(argv: list[str]) -> argparse.Namespace:
    """--json/--junit (and the command) from argv that failed to parse: a usage error is
    still reported where CI looks for results."""
    scan = argparse.ArgumentParser(add_help=False)
    scan.add_argument("--json", type=Path, dest="json_path")
    scan.add_argument("--junit", type=Path, dest="junit_path")
    try:
        ns, rest = scan.parse_known_args(argv)
    except SystemExit:  # e.g. --json without a value
        return argparse.Namespace(json_path=None, junit_path=None, command=None)
    ns.command = next((a for a in rest if a in COMMANDS), None)
    return ns


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _inventory_from_cfg(project_dir: Path) -> list[Path]:
    cfg = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
    cfg.read(project_dir / "ansible.cfg")
    value = cfg.get("defaults", "inventory", fallback="").strip()
    if not value:
        raise UsageError(f"no --inventory given and {project_dir / 'ansible.cfg'} sets no inventory")
    return [(project_dir / part.strip()).resolve() for part in value.split(",") if part.strip()]


def _artifacts_dir(requested: Path | None, project_dir: Path, command: str, started: datetime) -> Path:
    if requested is not None:
        path = requested.expanduser().resolve()
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            # A reused dir would mix this run's reports with an old run's (a stale
            # preflight.json would decide the outcome) and ansible-runner would reuse env/.
            raise UsageError(f"--artifacts {requested}: exists and is not empty; give a new directory")
        path.mkdir(parents=True, exist_ok=True)
        return path
    base = project_dir / "reports" / "runs"
    base.mkdir(parents=True, exist_ok=True)
    stamp = started.astimezone().strftime("%Y%m%dT%H%M%S")
    for n in range(1, 1000):
        path = base / (f"{stamp}-{command}" if n == 1 else f"{stamp}-{command}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UsageError(f"cannot make a new run directory under {base}")


class Plan:
    """Everything checked before anything runs."""

    def __init__(self, args: argparse.Namespace, cwd: Path):
        self.command: str = args.command
        project = args.project_dir.expanduser().resolve()
        if not (project / "ansible.cfg").is_file():
            raise UsageError(f"--project-dir {args.project_dir}: no ansible.cfg there (is it a vllm-fleet checkout?)")
        self.project_dir = project
        rel = COMMANDS[self.command][0]
        self.playbook_rel = rel
        self.playbook = project / rel
        if not self.playbook.is_file():
            raise UsageError(f"{self.command}: playbook {rel} does not exist in {project}")
        if args.inventory:
            self.inventories = []
            for raw in args.inventory:
                path = Path(raw).expanduser()
                path = (cwd / path).resolve() if not path.is_absolute() else path
                if not path.exists():
                    raise UsageError(f"--inventory {raw}: no such file or directory")
                self.inventories.append(path)
        else:
            self.inventories = _inventory_from_cfg(project)
            missing = [p for p in self.inventories if not p.exists()]
            if missing:
                raise UsageError(f"the ansible.cfg inventory {missing[0]} does not exist; give --inventory")
        if args.limit is not None and not args.limit.strip():
            raise UsageError("--limit: empty pattern")
        self.limit = args.limit
        self.check = bool(args.check)
        reserved = {REPORT_DIR_VAR: "--artifacts (reports go to <artifacts>/reports)"}
        if self.command == "coredumps":
            reserved[COREDUMP_ACTION_VAR] = "the coredumps action argument"
        try:
            self.extravars = parse_extra_vars(args.extra_vars, project_dir=project, cwd=cwd, reserved=reserved)
        except ExtraVarsError as exc:
            raise UsageError(str(exc)) from None
        # Vaulted -e @files go to ansible-playbook by path, with the vault options.
        self.vault_files = vault_files(args.extra_vars, cwd=cwd)
        self.vault_ids = list(args.vault_id)
        self.vault_password_files = []
        for raw in args.vault_password_file:
            path = raw if raw.is_absolute() else cwd / raw
            if not path.is_file():
                raise UsageError(f"--vault-password-file {raw}: no such file")
            self.vault_password_files.append(path.resolve())
        if self.command == "coredumps":
            self.extravars[COREDUMP_ACTION_VAR] = args.action


def summary_dict(*, command: str | None, plan: Plan | None, decision: Decision, rc: int | None,
                 started: datetime, finished: datetime, artifacts: Path | None,
                 report_files: list[str] | None = None, problems: list[str] | None = None) -> dict:
    return {
        "command": command,
        "playbook": plan.playbook_rel if plan else (COMMANDS[command][0] if command in COMMANDS else None),
        "inventory": [str(p) for p in plan.inventories] if plan else None,
        "limit": plan.limit if plan else None,
        "check": bool(plan and plan.check),
        "rc": rc,
        "outcome": OUTCOMES[decision.exit_code],
        "outcomes": decision.outcomes,
        "exit_code": int(decision.exit_code),
        "message": decision.message,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds(), 3),
        "artifacts": str(artifacts) if artifacts else None,
        "report_dir": str(artifacts / "reports") if artifacts else None,
        "reports": report_files or [],
        "problems": problems or [],
        "hosts": decision.hosts,
        "report_html": None,  # <artifacts>/rollout.html once written (rollout, rollback)
    }


def write_outputs(summary: dict, json_paths: list[Path], junit_paths: list[Path]) -> None:
    for path in json_paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    for path in junit_paths:
        junit.write(summary, path)


def _print_result(summary: dict, out: TextIO) -> None:
    """The result on the operator's terminal: host names and messages are others' text, cleaned."""
    print(clean(f"vllm-fleet {summary['command']}: {summary['outcome']} (exit {summary['exit_code']}): "
                f"{summary['message']}"), file=out)
    hosts = summary.get("hosts") or {}
    width = max([len(h) for h in hosts] + [4])
    for host, info in hosts.items():
        first = next((line for line in (info.get("message") or "").splitlines() if line.strip()), "")
        verdicts = "".join(f" {key}={info[f'{key}_verdict']}" for key in ("preflight", "soak")
                           if info.get(f"{key}_verdict"))
        print(terminal_text.one_line(f"  {host:<{width}} {info['status']:<12}{verdicts} {first[:160]}").rstrip(),
              file=out)
    if summary.get("artifacts"):
        print(f"  artifacts: {summary['artifacts']}", file=out)
    if summary.get("report_html"):
        print(f"  report: {summary['report_html']}", file=out)
    out.flush()


def write_html_report(report_dir: Path, output: Path, summary: dict | None) -> Path | None:
    """The run's HTML report; a report that cannot be written is said, never fatal to the run."""
    try:
        return html_report.build_report(report_dir, output, summary)
    except Exception as exc:  # noqa: BLE001 -- the run's result matters more than its page
        print(f"vllm-fleet: warning: cannot write the HTML report {output}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


def report_main(args: argparse.Namespace, out: TextIO) -> int:
    """`vllm-fleet report DIR`: rebuild rollout.html from a run's files."""
    path = args.dir.expanduser().resolve()
    if not path.is_dir():
        print(f"vllm-fleet: error: report {args.dir}: not a directory", file=sys.stderr)
        return int(ExitCode.USAGE)
    report_dir = path / "reports" if (path / "reports").is_dir() else path
    summary = None
    summary_path = path / "summary.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            print(f"vllm-fleet: warning: {summary_path} is unreadable ({exc}): the report goes without it",
                  file=sys.stderr)
        if not isinstance(summary, dict):
            summary = None
    output = args.output.expanduser().resolve() if args.output else path / html_report.REPORT_FILE
    written = write_html_report(report_dir, output, summary)
    if written is None:
        return int(ExitCode.FAILED)
    print(written, file=out)
    out.flush()
    return int(ExitCode.SUCCESS)


def _usage_exit(message: str, ns: argparse.Namespace, started: datetime, plan: Plan | None = None) -> int:
    print(f"vllm-fleet: error: {message}", file=sys.stderr)
    print("Try 'vllm-fleet --help' (exit codes are listed there).", file=sys.stderr)
    decision = Decision(ExitCode.USAGE, [OUTCOMES[ExitCode.USAGE]], {}, message)
    summary = summary_dict(command=getattr(ns, "command", None), plan=plan, decision=decision, rc=None,
                           started=started, finished=_now(), artifacts=None)
    paths_json = [p for p in [getattr(ns, "json_path", None)] if p]
    paths_junit = [p for p in [getattr(ns, "junit_path", None)] if p]
    try:
        write_outputs(summary, paths_json, paths_junit)
    except OSError as exc:
        print(f"vllm-fleet: error: cannot write the result: {exc}", file=sys.stderr)
    return int(ExitCode.USAGE)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out = out or sys.stdout
    started = _now()
    cwd = Path.cwd()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _usage_exit(str(exc), _prescan_outputs(argv), started)
    if args.command == "report":
        return report_main(args, out)
    try:
        plan = Plan(args, cwd)
        artifacts = _artifacts_dir(args.artifacts, plan.project_dir, plan.command, started)
    except UsageError as exc:
        return _usage_exit(str(exc), args, started)
    except OSError as exc:
        return _usage_exit(f"--artifacts: {exc}", args, started)

    from .runner import RunRequest, run  # ansible-runner is only needed to run

    report_dir = artifacts / "reports"
    report_dir.mkdir(exist_ok=True)  # playbooks write their reports here (vllm_fleet_report_dir)
    request = RunRequest(project_dir=plan.project_dir, playbook=plan.playbook, inventories=plan.inventories,
                         private_data_dir=artifacts, ident=plan.command, limit=plan.limit,
                         extravars={**plan.extravars, REPORT_DIR_VAR: str(report_dir)}, check=plan.check,
                         vault_files=plan.vault_files, vault_ids=plan.vault_ids,
                         vault_password_files=plan.vault_password_files)
    formatter = ProgressFormatter(verbose=args.verbose)
    events: list[dict] = []

    show = [not args.quiet]

    def on_event(event: dict) -> None:
        events.append(event)
        if show[0]:
            try:
                for line in formatter.format(event):
                    print(line, file=out)
                out.flush()
            except (OSError, ValueError):  # stdout went away (a closed pipe): keep running
                show[0] = False

    if not args.quiet:
        print(f"vllm-fleet {plan.command}: {plan.playbook_rel} on "
              f"{', '.join(str(p) for p in plan.inventories)}"
              + (f" --limit {plan.limit}" if plan.limit else "") + (" (check mode)" if args.check else ""),
              file=out)
        out.flush()
    rc = status = None
    crash = None
    try:
        result = run(request, on_event)
        rc, status = result.rc, result.status
    except Exception as exc:  # the runner itself broke: say so, keep the evidence
        crash = f"ansible-runner failed: {type(exc).__name__}: {exc}"
        (artifacts / "cli-error.txt").write_text(traceback.format_exc())

    facts = collect(events)
    reports = read_reports(report_dir)
    decision = decide(facts, reports, rc, status, limit=plan.limit)
    if crash:
        decision = Decision(ExitCode.FAILED, [OUTCOMES[ExitCode.FAILED]], decision.hosts, crash)
    summary = summary_dict(command=plan.command, plan=plan, decision=decision, rc=rc, started=started,
                           finished=_now(), artifacts=artifacts, report_files=reports.files,
                           problems=reports.problems)
    if plan.command in HTML_REPORT_COMMANDS:
        written = write_html_report(report_dir, artifacts / html_report.REPORT_FILE, summary)
        summary["report_html"] = str(written) if written else None
    json_paths = [artifacts / "summary.json"] + ([args.json_path] if args.json_path else [])
    junit_paths = [artifacts / "junit.xml"] + ([args.junit_path] if args.junit_path else [])
    try:
        write_outputs(summary, json_paths, junit_paths)
    except OSError as exc:
        print(f"vllm-fleet: error: cannot write the result: {exc}", file=sys.stderr)
        if decision.exit_code == ExitCode.SUCCESS:
            return int(ExitCode.FAILED)
    _print_result(summary, out)
    return int(decision.exit_code)
