"""The known-issues catalogue: load and validate it, evaluate it, judge a planned rollout.

Plain Python on purpose (no ``ansible`` import): the preflight module is a thin wrapper and
everything here is unit-tested without Ansible. Shapes are those of docs/CONTRACTS.md: the
catalogue schema, the ``vllm_fleet_gpu`` facts and the plan ``{versions, serve_args, env}``.
Versions are compared with ``packaging`` only.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

SCHEMA_VERSION = 1
SEVERITIES = ("blocker", "warning")
MATCH_KEYS = ("compute_capability", "versions", "serve_args", "env", "gpu")
VERSION_KEYS = ("vllm", "torch", "cudnn", "cuda_driver", "nvidia_driver")
# These describe the node, not the release: they come from the GPU facts, never the plan.
FACT_VERSIONS = {"cuda_driver": "cuda_driver_version", "nvidia_driver": "driver_version"}
PLAN_VERSION_KEYS = tuple(k for k in VERSION_KEYS if k not in FACT_VERSIONS)
PLAN_KEYS = ("versions", "serve_args", "env")
MATCHER_KINDS = ("in", "not_in")
ENTRY_REQUIRED = ("id", "title", "severity", "match", "symptom", "evidence", "fix")
ENTRY_OPTIONAL = ("kernel_patterns",)
# Device fields of vllm_fleet_gpu (CONTRACTS.md): a gpu matcher on anything else is a typo
# that would silently never match.
GPU_DEVICE_FIELDS = (
    "index", "name", "uuid", "pci_bus_id", "compute_capability", "sm", "architecture",
    "gpu_class", "memory_total_bytes", "shared_memory_per_block_optin_bytes",
    "shared_memory_per_block_optin_source", "ecc_enabled", "mig_enabled",
    "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable",
    "remapped_rows_pending", "remapped_rows_failure",
)
ID_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
CC_RE = re.compile(r"[0-9]+\.[0-9]+\Z")


class CatalogueError(ValueError):
    """The catalogue does not follow the schema; the message names the entry and field."""


class PlanError(ValueError):
    """A plan, the GPU facts or the accepted risks cannot be judged as given."""


@dataclass(frozen=True)
class Matcher:
    kind: str  # "in" or "not_in"
    values: tuple

    def matches(self, actual: Any) -> bool:
        hit = any(_same_value(actual, expected) for expected in self.values)
        return hit if self.kind == "in" else not hit

    def __str__(self) -> str:
        return f"{self.kind.replace('_', ' ')} {_show(list(self.values))}"


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    severity: str
    compute_capability: tuple[str, ...]
    versions: dict[str, SpecifierSet]
    serve_args: dict[str, Matcher]
    env: dict[str, Matcher]
    gpu: dict[str, Matcher]
    symptom: str
    evidence: tuple[str, ...]
    fix: str
    kernel_patterns: tuple[str, ...]

    @property
    def per_device(self) -> bool:
        return bool(self.compute_capability or self.gpu)


def _same_value(actual: Any, expected: Any) -> bool:
    # bool is an int in Python: keep `true` from matching 1, and "true" from matching true.
    if isinstance(actual, bool) or isinstance(expected, bool) or actual is None or expected is None:
        return actual is expected
    return str(actual) == str(expected)


def _show(value: Any) -> str:
    return "unset" if value is None else json.dumps(value)


def normalise_arg(name: str) -> str:
    """`--kv_cache_dtype` and `kv-cache-dtype` name the same vLLM flag."""
    return name.lstrip("-").replace("_", "-")


# --- loading -------------------------------------------------------------------------------

class _Where:
    """Builds error messages that name the entry (index and id) and the field."""

    def __init__(self, index: int | None = None, entry_id: Any = None):
        if index is None:
            self.prefix = "catalogue"
        else:
            label = f"id {entry_id!r}" if isinstance(entry_id, str) else "no id"
            self.prefix = f"known_issues[{index}] ({label})"

    def error(self, field: str, problem: str) -> CatalogueError:
        return CatalogueError(f"{self.prefix}: field {field!r}: {problem}")


def _nonempty_str(where: _Where, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.error(field, f"{value!r} is not allowed: a non-empty string is required")
    return value


def _str_list(where: _Where, field: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise where.error(field, f"{value!r} is not allowed: a non-empty list of strings is required")
    for i, item in enumerate(value):
        _nonempty_str(where, f"{field}[{i}]", item)
    return tuple(value)


def _mapping(where: _Where, field: str, value: Any) -> dict:
    if not isinstance(value, dict) or not value:
        raise where.error(field, f"{value!r} is not allowed: a non-empty mapping is required")
    for key in value:
        if not isinstance(key, str):
            raise where.error(field, f"key {key!r} is not allowed: keys are strings")
    return value


def _matcher(where: _Where, field: str, value: Any, strings_only: bool = False) -> Matcher:
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in MATCHER_KINDS:
        raise where.error(field, f"{value!r} is not a value matcher: exactly one of "
                                 "{in: [...]} or {not_in: [...]} is allowed")
    kind, values = next(iter(value.items()))
    if not isinstance(values, list) or not values:
        raise where.error(f"{field}.{kind}", f"{values!r} is not allowed: a non-empty list is required")
    for i, item in enumerate(values):
        if strings_only and not (item is None or isinstance(item, str)):
            raise where.error(f"{field}.{kind}[{i}]", f"{item!r} is not allowed: environment "
                                                      "values are strings, quote it")
        if not (item is None or isinstance(item, (str, int, float, bool))):
            raise where.error(f"{field}.{kind}[{i}]", f"{item!r} is not allowed: a string, "
                                                      "number, boolean or null is required")
    return Matcher(kind, tuple(values))


def _match(where: _Where, value: Any) -> dict[str, Any]:
    match = _mapping(where, "match", value)
    unknown = [k for k in match if k not in MATCH_KEYS]
    if unknown:
        raise where.error(f"match.{unknown[0]}", f"unknown match key, allowed: {', '.join(MATCH_KEYS)}")
    out: dict[str, Any] = {"compute_capability": (), "versions": {}, "serve_args": {}, "env": {}, "gpu": {}}

    if "compute_capability" in match:
        ccs = match["compute_capability"]
        if not isinstance(ccs, list) or not ccs:
            raise where.error("match.compute_capability", f"{ccs!r} is not allowed: a non-empty "
                                                          "list of quoted strings like \"12.0\" is required")
        for i, cc in enumerate(ccs):
            if not isinstance(cc, str) or not CC_RE.match(cc):
                raise where.error(f"match.compute_capability[{i}]",
                                  f"{cc!r} is not allowed: a quoted \"major.minor\" string like \"12.0\" is required")
        out["compute_capability"] = tuple(ccs)

    if "versions" in match:
        for key, spec in _mapping(where, "match.versions", match["versions"]).items():
            field = f"match.versions.{key}"
            if key not in VERSION_KEYS:
                raise where.error(field, f"unknown version key, allowed: {', '.join(VERSION_KEYS)}")
            if not isinstance(spec, str) or not spec.strip():
                raise where.error(field, f"{spec!r} is not allowed: a quoted PEP 440 specifier "
                                         "like \"<9.23.1\" is required")
            try:
                out["versions"][key] = SpecifierSet(spec)
            except InvalidSpecifier:
                raise where.error(field, f"{spec!r} is not a valid PEP 440 specifier set "
                                         "(e.g. \"<9.23.1\", \">=0.21,<0.26\")") from None

    if "serve_args" in match:
        for name, matcher in _mapping(where, "match.serve_args", match["serve_args"]).items():
            key = normalise_arg(name)
            if key in out["serve_args"]:
                raise where.error(f"match.serve_args.{name}", f"names the same flag as {key!r} twice")
            out["serve_args"][key] = _matcher(where, f"match.serve_args.{name}", matcher)

    if "env" in match:
        for name, matcher in _mapping(where, "match.env", match["env"]).items():
            out["env"][name] = _matcher(where, f"match.env.{name}", matcher, strings_only=True)

    if "gpu" in match:
        for name, matcher in _mapping(where, "match.gpu", match["gpu"]).items():
            if name not in GPU_DEVICE_FIELDS:
                raise where.error(f"match.gpu.{name}", "not a device field of the GPU facts, allowed: "
                                                       f"{', '.join(GPU_DEVICE_FIELDS)}")
            out["gpu"][name] = _matcher(where, f"match.gpu.{name}", matcher)
    return out


def _entry(index: int, raw: Any, seen: set[str]) -> Entry:
    if not isinstance(raw, dict):
        raise CatalogueError(f"known_issues[{index}]: {raw!r} is not allowed: an entry is a mapping")
    where = _Where(index, raw.get("id"))
    for field in ENTRY_REQUIRED:
        if field not in raw:
            raise where.error(field, "is required")
    unknown = [k for k in raw if k not in ENTRY_REQUIRED + ENTRY_OPTIONAL]
    if unknown:
        raise where.error(str(unknown[0]), f"unknown field, allowed: {', '.join(ENTRY_REQUIRED + ENTRY_OPTIONAL)}")

    entry_id = raw["id"]
    if not isinstance(entry_id, str) or not ID_RE.match(entry_id):
        raise where.error("id", f"{entry_id!r} is not allowed: lower-case letters, digits and "
                                "dashes, starting with a letter or digit ([a-z0-9][a-z0-9-]*)")
    if entry_id in seen:
        raise where.error("id", f"{entry_id!r} is a duplicate: ids are unique")
    seen.add(entry_id)
    if raw["severity"] not in SEVERITIES:
        raise where.error("severity", f"{raw['severity']!r} is not one of: {', '.join(SEVERITIES)}")
    match = _match(where, raw["match"])
    return Entry(
        id=entry_id,
        title=_nonempty_str(where, "title", raw["title"]),
        severity=raw["severity"],
        symptom=_nonempty_str(where, "symptom", raw["symptom"]),
        evidence=_str_list(where, "evidence", raw["evidence"]),
        fix=_nonempty_str(where, "fix", raw["fix"]),
        kernel_patterns=_str_list(where, "kernel_patterns", raw["kernel_patterns"])
        if "kernel_patterns" in raw else (),
        **match,
    )


def load_catalogue(data: Any) -> list[Entry]:
    """Validate a parsed catalogue document and return its entries; raise CatalogueError."""
    where = _Where()
    if not isinstance(data, dict):
        raise CatalogueError(f"catalogue: {data!r} is not allowed: the catalogue is a mapping "
                             "with schema_version and known_issues (the parsed YAML document)")
    for field in ("schema_version", "known_issues"):
        if field not in data:
            raise where.error(field, "is required")
    unknown = [k for k in data if k not in ("schema_version", "known_issues")]
    if unknown:
        raise where.error(str(unknown[0]), "unknown field, allowed: schema_version, known_issues")
    version = data["schema_version"]
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise where.error("schema_version", f"{version!r} is not supported (supported: {SCHEMA_VERSION})")
    issues = data["known_issues"]
    if not isinstance(issues, list) or not issues:
        raise where.error("known_issues", f"{issues!r} is not allowed: a non-empty list of entries "
                                          "is required")
    seen: set[str] = set()
    return [_entry(i, raw, seen) for i, raw in enumerate(issues)]


# --- evaluation ----------------------------------------------------------------------------

def _parse_version(label: str, value: Any) -> tuple[str, Version] | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PlanError(f"{label}: {value!r} is not a version: a string like \"9.24.0.43\" is required")
    try:
        return str(value), Version(str(value))
    except InvalidVersion:
        raise PlanError(f"{label}: {str(value)!r} is not a valid version (PEP 440), "
                        "e.g. \"9.24.0.43\" or \"0.25.1\"") from None


def _check_gpu_facts(gpu_facts: Any) -> list[dict]:
    if not isinstance(gpu_facts, dict):
        raise PlanError(f"gpu facts: {gpu_facts!r} is not the vllm_fleet_gpu facts mapping")
    if gpu_facts.get("available") is not True:
        error, reason = gpu_facts.get("error") or "no error given", gpu_facts.get("reason") or "no reason given"
        raise PlanError(f"gpu facts: the GPU is not available ({error}: {reason}); "
                        "preflight cannot judge a node without its GPU facts")
    devices = gpu_facts.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, dict) and isinstance(d.get("index"), int)
                                                for d in devices):
        raise PlanError("gpu facts: devices must be a list of devices, each with an integer index")
    return devices


def _plan_inputs(label: str, plan: Any, gpu_facts: dict) -> tuple[dict, dict, dict]:
    if not isinstance(plan, dict):
        raise PlanError(f"{label}: {plan!r} is not a plan: a mapping with versions, serve_args, env "
                        "is required")
    unknown = [k for k in plan if k not in PLAN_KEYS]
    if unknown:
        raise PlanError(f"{label}: {unknown[0]!r} is not one of: {', '.join(PLAN_KEYS)}")
    parts = {}
    for key in PLAN_KEYS:
        part = plan.get(key) or {}
        if not isinstance(part, dict) or not all(isinstance(k, str) for k in part):
            raise PlanError(f"{label}: {key}: {part!r} is not a mapping with string keys")
        parts[key] = part

    versions: dict[str, tuple[str, Version] | None] = {}
    for key, value in parts["versions"].items():
        if key in FACT_VERSIONS:
            raise PlanError(f"{label}: versions.{key}: comes from the GPU facts ({FACT_VERSIONS[key]}), "
                            "not the plan; remove it")
        if key not in PLAN_VERSION_KEYS:
            raise PlanError(f"{label}: versions.{key}: {key!r} is not one of: {', '.join(PLAN_VERSION_KEYS)}")
        versions[key] = _parse_version(f"{label}: versions.{key}", value)
    for key, field in FACT_VERSIONS.items():
        versions[key] = _parse_version(f"gpu facts: {field}", gpu_facts.get(field))

    serve_args: dict[str, Any] = {}
    for name, value in parts["serve_args"].items():
        key = normalise_arg(name)
        if key in serve_args and not _same_value(serve_args[key], value):
            raise PlanError(f"{label}: serve_args: {name!r} sets {key!r} again, to a different value")
        serve_args[key] = value

    env = {name: None if value is None else str(value) for name, value in parts["env"].items()}
    return versions, serve_args, env


def _group(reasons: dict[str, list[int]]) -> list[str]:
    out = []
    for reason, devices in reasons.items():
        word = "device" if len(devices) == 1 else "devices"
        out.append(f"{reason} ({word} {', '.join(str(d) for d in devices)})")
    return out


def _evaluate_entry(entry: Entry, devices: list[dict], versions: dict, serve_args: dict,
                    env: dict) -> tuple[list[int], list[str]] | None:
    matched = []
    for key, spec in entry.versions.items():
        known = versions.get(key)
        # An unknown version never matches: the catalogue cannot judge what it cannot see.
        # prereleases=True: rc and dev builds are judged too (older packaging skips them).
        if known is None or not spec.contains(known[1], prereleases=True):
            return None
        matched.append(f"{key} {known[0]} matches {spec}")
    for label, matchers, values in (("serve arg", entry.serve_args, serve_args), ("env", entry.env, env)):
        for name, matcher in matchers.items():
            value = values.get(name)
            if not matcher.matches(value):
                return None
            matched.append(f"{label} {name} is {_show(value)} ({matcher})")

    if not entry.per_device:
        return [d["index"] for d in devices], matched
    hits: list[int] = []
    device_reasons: dict[str, list[int]] = {}
    for device in devices:
        reasons = []
        if entry.compute_capability:
            cc = device.get("compute_capability")
            if cc not in entry.compute_capability:
                continue
            reasons.append(f"compute capability {cc}")
        if not all(m.matches(device.get(name)) for name, m in entry.gpu.items()):
            continue
        reasons += [f"{name} is {_show(device.get(name))} ({m})" for name, m in entry.gpu.items()]
        hits.append(device["index"])
        for reason in reasons:
            device_reasons.setdefault(reason, []).append(device["index"])
    if not hits:
        return None
    return hits, matched + _group(device_reasons)


def evaluate(entries: list[Entry], gpu_facts: dict, plan: dict, scope: str = "planned") -> list[dict]:
    """Every entry that matches the GPU facts and the plan, as finding dicts (CONTRACTS.md).

    Raises PlanError when the facts or the plan cannot be judged (e.g. an unparsable version).
    """
    devices = _check_gpu_facts(gpu_facts)
    versions, serve_args, env = _plan_inputs(f"{scope} plan", plan, gpu_facts)
    findings = []
    for entry in entries:
        hit = _evaluate_entry(entry, devices, versions, serve_args, env)
        if hit is None:
            continue
        findings.append({
            "id": entry.id,
            "title": entry.title,
            "severity": entry.severity,
            "scope": scope,
            "devices": hit[0],
            "matched": hit[1],
            "symptom": entry.symptom,
            "evidence": list(entry.evidence),
            "fix": entry.fix,
            "accepted": False,
            "accepted_reason": None,
        })
    return findings


def _accepted_reasons(entries: list[Entry], accepted: Any) -> dict[str, str]:
    known = [e.id for e in entries]
    if accepted is None:
        return {}
    if not isinstance(accepted, list):
        raise PlanError(f"accepted risks: {accepted!r} is not a list of {{id, reason}}")
    reasons = {}
    for i, item in enumerate(accepted):
        if not isinstance(item, dict):
            raise PlanError(f"accepted risks[{i}]: {item!r} is not a mapping with id and reason")
        risk_id = item.get("id")
        if risk_id not in known:
            raise PlanError(f"accepted risks[{i}]: id {risk_id!r} is not in the known-issues "
                            f"catalogue (known ids: {', '.join(known)})")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise PlanError(f"accepted risks[{i}] (id {risk_id!r}): a non-empty reason is required: "
                            "say why this risk is acceptable here")
        reasons[risk_id] = reason.strip()
    return reasons


def _unknown_versions(entries: list[Entry], plan: dict, gpu_facts: dict) -> list[str]:
    needed = {key for e in entries for key in e.versions}
    given = dict((plan or {}).get("versions") or {})
    given.update({key: gpu_facts.get(field) for key, field in FACT_VERSIONS.items()})
    return [key for key in VERSION_KEYS if key in needed and given.get(key) is None]


def _line(finding: dict) -> str:
    word = "device" if len(finding["devices"]) == 1 else "devices"
    devices = f" [{word} {', '.join(str(d) for d in finding['devices'])}]" if finding["devices"] else ""
    return f"{finding['id']}: {finding['title']}{devices}"


def judge(entries: list[Entry], gpu_facts: dict, current: dict | None, planned: dict,
          accepted: list[dict] | None) -> dict:
    """The preflight report: verdict pass | warn | block, findings and readable summary lines.

    Only unaccepted blockers of the planned config block. Findings of the current config are
    reported (they are why a rollout is needed) and never block.
    """
    reasons = _accepted_reasons(entries, accepted)
    if planned is None:
        raise PlanError("planned plan: is required (versions, serve_args, env of the release to roll out)")
    current_findings = [] if current is None else evaluate(entries, gpu_facts, current, scope="current")
    planned_findings = evaluate(entries, gpu_facts, planned, scope="planned")
    for finding in planned_findings:
        if finding["id"] in reasons:
            finding["accepted"] = True
            finding["accepted_reason"] = reasons[finding["id"]]
    blockers = [f for f in planned_findings if f["severity"] == "blocker" and not f["accepted"]]
    warnings = [f for f in planned_findings if f["severity"] == "warning" and not f["accepted"]]
    accepted_findings = [f for f in planned_findings if f["accepted"]]
    # An accepted warning is acknowledged; an accepted blocker is still a risk being run.
    accepted_blockers = [f for f in accepted_findings if f["severity"] == "blocker"]
    verdict = "block" if blockers else "warn" if warnings or accepted_blockers else "pass"

    summary = [f"verdict: {verdict} ({len(blockers)} blocker(s), {len(warnings)} warning(s), "
               f"{len(accepted_findings)} accepted; {len(entries)} known issues checked)"]
    planned_ids = {f["id"] for f in planned_findings}
    for f in current_findings:
        outcome = "still present in the planned config" if f["id"] in planned_ids else "fixed by the planned config"
        summary.append(f"current {f['severity']} {_line(f)} -- {outcome}")
    summary += [f"BLOCKER {_line(f)} -- fix: {f['fix']}" for f in blockers]
    summary += [f"accepted {f['severity']} {_line(f)} -- reason: {f['accepted_reason']}" for f in accepted_findings]
    summary += [f"warning {_line(f)} -- fix: {f['fix']}" for f in warnings]
    summary += [f"accepted risk {risk_id} does not match the planned config: remove it from the accepted risks"
                for risk_id in reasons if risk_id not in planned_ids]
    for label, plan in (("current", current), ("planned", planned)):
        unknown = [] if plan is None else _unknown_versions(entries, plan, gpu_facts)
        if unknown:
            summary.append(f"{label} config: version(s) unknown, entries that need them could not match: "
                           f"{', '.join(unknown)}")
    return {
        "verdict": verdict,
        "current": current_findings,
        "planned": planned_findings,
        "blockers": blockers,
        "accepted": accepted_findings,
        "warnings": warnings,
        "summary": summary,
    }


def blocked_message(report: dict) -> str:
    """Why the rollout is blocked: each blocker with its evidence and fix, and how to accept it."""
    lines = [f"preflight blocked the rollout: {len(report['blockers'])} known issue(s) in the planned config."]
    for f in report["blockers"]:
        lines.append(f"[{f['id']}] {f['title']}")
        lines.append(f"  matched: {'; '.join(f['matched'])}")
        lines.append(f"  symptom: {f['symptom']}")
        lines.append(f"  evidence: {' | '.join(f['evidence'])}")
        lines.append(f"  fix: {f['fix']}")
    example = ", ".join(f"{{id: {f['id']}, reason: \"...\"}}" for f in report["blockers"])
    lines.append("Fix the plan, or accept a risk explicitly with a reason: "
                 f"vllm_fleet_accepted_risks: [{example}]")
    return "\n".join(lines)


def match_kernel(entries: list[Entry], kernel_name: str) -> tuple[Entry, str] | None:
    """The first entry whose kernel_patterns match a GPU kernel name, and the pattern that
    matched (core-dump triage). Case-sensitive, like the names cuda-gdb prints."""
    for entry in entries:
        pattern = next((p for p in entry.kernel_patterns if fnmatch.fnmatchcase(kernel_name, p)), None)
        if pattern:
            return entry, pattern
    return None
