# SPDX-License-Identifier: Apache-2.0
"""Side-by-side releases: their names, what a build resolved, and pruning old ones.

A release is one venv under ``<vllm_fleet_root>/releases/<release_id>``, named from its
pinned set (vLLM and the cuDNN override). It is built in ``releases/.staging-<id>``
and renamed into place only once its manifest (``vllm-fleet-release.json``) is written,
so a directory under ``releases/`` whose manifest exists is complete. The service role
owns the ``current`` and ``known-good`` links next to ``releases/``; here they are only
read, so that pruning never removes what they point at.

Plain Python, no Ansible: the filters of the vllm_runtime role and the release_prune
module call in here, and tests/unit calls it directly. ``packaging`` is imported only by
the functions that compare versions, so pruning works without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass

MANIFEST_NAME = "vllm-fleet-release.json"
MANIFEST_SCHEMA_VERSION = 1
STAGING_PREFIX = ".staging-"
# A pruned release is renamed to this first, then deleted: a half-deleted tree never
# looks like a release, and the next prune finishes the job.
PRUNING_PREFIX = ".pruning-"
DEFAULT_LINKS = ("current", "known-good")

RELEASE_REQUIRED = ("vllm", "cudnn_package", "cudnn")
RELEASE_OPTIONAL = ("torch",)
# Separates the parts of a release id: normalised project names and normalised PEP 440
# versions never contain "_", so the id splits back unambiguously.
ID_SEPARATOR = "_"
_PROJECT_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_SAFE_VERSION = re.compile(r"^[0-9a-z.+-]+$")
_RELEASE_ID = re.compile(r"^[0-9a-z][0-9a-z.+_-]*$")


class ReleaseError(ValueError):
    """A release plan, lock or check output that cannot be used, with a readable reason."""


# --- the release id ------------------------------------------------------------------


def canonical_name(name, what: str) -> str:
    """PEP 503 normalised project name: 'NVIDIA_cuDNN.cu13' -> 'nvidia-cudnn-cu13'."""
    if not isinstance(name, str) or not _PROJECT_NAME.match(name.strip()):
        raise ReleaseError(f"{what}: {name!r} is not a Python project name (for example 'nvidia-cudnn-cu13')")
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def normalized_version(text, what: str) -> str:
    """The PEP 440 normal form of an exact version, safe in a directory name."""
    from packaging.version import InvalidVersion, Version

    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ReleaseError(f"{what}: {text!r} is not a version string (quote it, for example '9.24.0.43')")
    try:
        version = str(Version(str(text).strip()))
    except InvalidVersion:
        raise ReleaseError(
            f"{what}: {str(text)!r} is not an exact version (PEP 440, for example '9.24.0.43';"
            " a pin, not a range like '>=9.23')"
        ) from None
    if not _SAFE_VERSION.match(version):
        raise ReleaseError(f"{what}: {str(text)!r} has an epoch ('!'), which a release directory name cannot carry")
    return version


def validate_release(release, what: str = "vllm_fleet_release") -> dict:
    """The release plan with names and versions normalised; ReleaseError names a bad key."""
    if not isinstance(release, dict):
        raise ReleaseError(f"{what} must be a mapping with keys {', '.join(RELEASE_REQUIRED)}, not {type(release).__name__}")
    unknown = sorted(str(key) for key in release if key not in RELEASE_REQUIRED + RELEASE_OPTIONAL)
    if unknown:
        allowed = ", ".join(RELEASE_REQUIRED + RELEASE_OPTIONAL)
        raise ReleaseError(f"{what}: unknown key {', '.join(repr(k) for k in unknown)} (allowed: {allowed})")
    missing = [key for key in RELEASE_REQUIRED if release.get(key) in (None, "")]
    if missing:
        raise ReleaseError(f"{what}: missing {', '.join(repr(k) for k in missing)} (every release pins {', '.join(RELEASE_REQUIRED)})")
    plan = {
        "vllm": normalized_version(release["vllm"], f"{what}.vllm"),
        "cudnn_package": canonical_name(release["cudnn_package"], f"{what}.cudnn_package"),
        "cudnn": normalized_version(release["cudnn"], f"{what}.cudnn"),
    }
    if release.get("torch") not in (None, ""):
        plan["torch"] = normalized_version(release["torch"], f"{what}.torch")
    return plan


def release_id(release, what: str = "vllm_fleet_release") -> str:
    """'vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43' for {vllm: 0.25.1, cudnn_package: ..., cudnn: 9.24.0.43}.

    torch is not part of the id: vLLM pins it, so the same vLLM means the same torch.
    """
    plan = validate_release(release, what)
    return f"vllm-{plan['vllm']}{ID_SEPARATOR}{plan['cudnn_package']}-{plan['cudnn']}"


# --- what a build resolved -------------------------------------------------------------


_LOCK_OPTIONS = ("--index-url", "--extra-index-url", "--find-links", "--no-index", "-i ", "-f ")


def parse_lock(text: str) -> list:
    """Packages of a ``uv pip compile --generate-hashes`` lock: [{name, version, hashes}], by name.

    Every entry must be an exact ``name==version`` pin with at least one hash: that is
    what ``uv pip sync --require-hashes`` installs, and all the manifest may record.
    """
    if not isinstance(text, str):
        raise ReleaseError(f"the lock must be text, not {type(text).__name__}")
    logical, current = [], ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() and not current:
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append((current + line).strip())
        current = ""
    if current.strip():
        logical.append(current.strip())

    packages = {}
    for entry in filter(None, logical):
        if entry.startswith(_LOCK_OPTIONS):
            continue  # where uv looked (--emit-index-url and friends), not a package
        tokens = entry.split()
        hashes = [t.split("=", 1)[1] for t in tokens if t.startswith("--hash=")]
        spec = " ".join(t for t in tokens if not t.startswith("--hash="))
        requirement = spec.split(";", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;]+)$", requirement)
        if not match:
            raise ReleaseError(f"lock entry {entry[:120]!r} is not an exact 'name==version' pin")
        name = canonical_name(match.group(1), "lock entry")
        if not hashes:
            raise ReleaseError(f"lock entry {name}=={match.group(3)} has no --hash (compile with --generate-hashes)")
        packages[name] = {"name": name, "version": match.group(3), "hashes": sorted(set(hashes))}
    if not packages:
        raise ReleaseError("the lock lists no packages")
    return [packages[name] for name in sorted(packages)]


def _same_version(a, b) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(str(a)) == Version(str(b))
    except InvalidVersion:
        return str(a) == str(b)


_CHECK_NOISE = (
    re.compile(r"^Checked \d+ packages?"),
    re.compile(r"^Found \d+ incompatibilit"),
    re.compile(r"^All installed packages are compatible"),
    re.compile(r"^Using Python .* environment at"),
)
_REQUIRES_INSTALLED = re.compile(r"^The package `([^`]+)` requires `([^`]+)`, but `([^`]+)` is installed")
_REQUIRES_MISSING = re.compile(r"^The package `([^`]+)` requires `([^`]+)`, but it's not installed")


def parse_check(output: str) -> list:
    """What ``uv pip check`` reported: [{package, requires, installed, line}].

    A requirement that is missing has ``installed: null``; any other line that is not
    uv's summary is kept as ``{line}`` alone, so nothing it said can be lost.
    """
    found = []
    for raw in (output or "").splitlines():
        line = raw.strip()
        if not line or any(p.match(line) for p in _CHECK_NOISE):
            continue
        match = _REQUIRES_INSTALLED.match(line) or _REQUIRES_MISSING.match(line)
        if match:
            package, requires = match.group(1), match.group(2)
            installed = match.group(3) if match.re is _REQUIRES_INSTALLED else None
            found.append({"package": package, "requires": requires, "installed": installed, "line": line})
        else:
            found.append({"package": None, "requires": None, "installed": None, "line": line})
    return found


def _requirement_name(requirement: str) -> str | None:
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement or "")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def judge_check(result, release) -> dict:
    """Judge ``uv pip check``: the only incompatibility allowed is the cuDNN override itself.

    ``result`` is the registered command result (``rc``, ``stdout``, ``stderr``). An entry
    is expected when some package requires the overridden cuDNN package and the version
    installed is the override's; every other entry, or a check that did not run, is not.
    Returns {ok, expected, unexpected, output, message}.
    """
    plan = validate_release(release)
    result = result or {}
    output = "\n".join(part for part in (result.get("stdout") or "", result.get("stderr") or "") if part).strip()
    rc = result.get("rc")
    expected, unexpected = [], []
    if rc not in (0, 1):
        unexpected.append({"package": None, "requires": None, "installed": None,
                           "line": f"uv pip check did not run to completion (exit status {rc})"})
    for entry in parse_check(output):
        override = (
            entry["package"] is not None
            and _requirement_name(entry["requires"]) == plan["cudnn_package"]
            and entry["installed"] is not None
            and _same_version(entry["installed"], plan["cudnn"])
        )
        (expected if override else unexpected).append(entry)
    if unexpected:
        message = (
            f"uv pip check found what the {plan['cudnn_package']} {plan['cudnn']} override does not explain: "
            + "; ".join(e["line"] for e in unexpected)
        )
    elif expected:
        message = "uv pip check reports only the intended override: " + "; ".join(e["line"] for e in expected)
    else:
        message = f"uv pip check reports no incompatibility (nothing pins {plan['cudnn_package']} below the override)"
    return {"ok": not unexpected, "expected": expected, "unexpected": unexpected, "output": output, "message": message}


def judge_cudnn(facts, release) -> dict:
    """Does torch in the venv load cuDNN at or above the pin (major.minor.patch)?

    ``facts`` is the ``cudnn`` result of vllm_fleet.fleet.cudnn_facts. The pin
    9.24.0.43 is the wheel's version; the library reports 9.24.0, so the comparison is
    on the first three release numbers, with packaging. Returns {ok, required, loaded,
    message}; the message carries the facts' own sentence as evidence.
    """
    from packaging.version import Version

    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.versions import release_string

    plan = validate_release(release)
    facts = facts or {}
    required = release_string(plan["cudnn"], "vllm_fleet_release.cudnn")
    loaded = facts.get("torch_cudnn_version")
    venv = facts.get("venv", "the release")
    evidence = facts.get("message") or "no cuDNN facts"
    if not loaded:
        why = facts.get("torch_error") or (
            "torch is not installed" if not facts.get("torch_version") else "torch reported no cuDNN"
        )
        return {"ok": False, "required": required, "loaded": None,
                "message": f"torch in {venv} does not report the cuDNN it loads ({why}), so the "
                           f"{plan['cudnn_package']} {plan['cudnn']} override cannot be confirmed. Facts: {evidence}"}
    ok = Version(loaded) >= Version(required)
    if ok:
        message = f"torch {facts.get('torch_version')} in {venv} loads cuDNN {loaded}, at or above the pin {required}."
    else:
        message = (
            f"torch {facts.get('torch_version')} in {venv} loads cuDNN {loaded}, below the pinned "
            f"{plan['cudnn_package']} {plan['cudnn']} ({required}): the override did not take effect. Facts: {evidence}"
        )
    return {"ok": ok, "required": required, "loaded": loaded, "message": message}


_MISSING_PATTERNS = (
    re.compile(r"there is no version of ([^\s,]+)"),
    re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the (?:provided package locations|package registry)"),
)
# uv 0.13.9 under --only-binary :all:, for a package with only a source distribution:
# "hint: Wheels are required for `tinysdist` because building from source is disabled for all
# packages (i.e., with `--no-build`)".
_SOURCE_ONLY = re.compile(r"Wheels are required for `([^`]+)` because building from source is disabled")
BUILD_VARIABLE = "vllm_fleet_runtime_build_from_source"


# user:password@ (or a token@) in a URL: never written to a manifest, a message or a report.
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")


def redact_url(text) -> str:
    """``https://user:token@host/simple`` -> ``https://<redacted>@host/simple``, anywhere in ``text``."""
    return _URL_CREDENTIALS.sub(r"\1<redacted>@", str(text))


def describe_source(source) -> str:
    """'the offline wheelhouse /srv/wheelhouse' or 'index https://pypi.org/simple' (+ find-links)."""
    source = source or {}
    find_links = [str(f) for f in source.get("find_links") or []]
    if source.get("offline"):
        where = "the offline wheelhouse " + ", ".join(find_links) if find_links else "no package source (offline, no find-links)"
        return where
    parts = [f"index {source.get('index_url') or 'https://pypi.org/simple (uv default)'}"]
    parts += [f"extra index {url}" for url in source.get("extra_index_urls") or []]
    parts += [f"find-links {path}" for path in find_links]
    return redact_url(", ".join(parts))


def resolve_failure(result, release, source) -> str:
    """A readable sentence for a failed ``uv pip compile``: the release, what is missing, where uv looked."""
    plan = validate_release(release)
    result = result or {}
    stderr = (result.get("stderr") or "").strip()
    missing = []
    for pattern in _MISSING_PATTERNS:
        for name in pattern.findall(stderr):
            if name not in missing:
                missing.append(name)
    source_only = list(dict.fromkeys(_SOURCE_ONLY.findall(stderr)))
    what = f"vllm=={plan['vllm']} with {plan['cudnn_package']}=={plan['cudnn']} overridden"
    if source_only:
        names = " and ".join(source_only)
        why = (f"{names} {'has' if len(source_only) == 1 else 'have'} no binary wheel there, only a source "
               "distribution, and none is built unless allowed (its build backend would run as root). If you "
               f"trust it, allow it by name: {BUILD_VARIABLE}: {json.dumps(source_only)}")
    elif missing:
        why = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not available there"
    else:
        why = "uv could not resolve it (see below)"
    tail = "\n".join(stderr.splitlines()[-12:]) or f"(no output, exit status {result.get('rc')})"
    return redact_url(
        f"release {release_id(plan)}: cannot resolve {what} from {describe_source(source)}: {why}. "
        f"Nothing was installed: releases/{release_id(plan)} was not created and the serving release is untouched. "
        f"uv said:\n{tail}"
    )


_FACT_KEYS = (
    "status", "torch_version", "torch_cudnn_version", "torch_cudnn_version_raw", "library_version",
    "library_version_raw", "vllm_version", "effective_version", "effective_source", "mismatch",
    "mismatch_detail",
)


def build_manifest(*, release, lock_text, check, cudnn_facts, cudnn_required_by, tools, source, created,
                   created_by="vllm_fleet.fleet.vllm_runtime") -> dict:
    """The manifest written into a release (``vllm-fleet-release.json``).

    Raises ReleaseError when the lock does not hold what the plan pins: vllm at its pin,
    the cuDNN package at the override, torch at the plan's torch (when given), or when
    the check found more than the override. ``check`` is judge_check's result;
    ``cudnn_required_by`` maps each installed package that requires the cuDNN package
    to its requirement strings (torch: ['nvidia-cudnn-cu13==9.19.0.56']).
    """
    plan = validate_release(release)
    packages = parse_lock(lock_text)
    by_name = {p["name"]: p for p in packages}
    wanted = [("vllm", plan["vllm"]), (plan["cudnn_package"], plan["cudnn"])]
    if "torch" in plan:
        wanted.append(("torch", plan["torch"]))
    for name, version in wanted:
        got = by_name.get(name)
        if got is None or not _same_version(got["version"], version):
            found = f"{name}=={got['version']}" if got else f"no {name}"
            raise ReleaseError(f"release {release_id(plan)}: the lock has {found}, but the plan pins {name}=={version}")
    if not check.get("ok"):
        raise ReleaseError(check.get("message") or "uv pip check found unexpected incompatibilities")

    package = plan["cudnn_package"]
    required_by = {
        canonical_name(dist, "requiring package"): sorted(reqs)
        for dist, reqs in (cudnn_required_by or {}).items()
        if reqs
    }
    facts = {key: (cudnn_facts or {}).get(key) for key in _FACT_KEYS}
    facts["wheels"] = [{"name": w.get("name"), "version": w.get("version")} for w in (cudnn_facts or {}).get("wheels") or []]
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "release_id": release_id(plan),
        "created": created,
        "created_by": created_by,
        "pins": plan,
        "requirements": [f"vllm=={plan['vllm']}"],
        "overrides": [f"{package}=={plan['cudnn']}"],
        "override": {
            "package": package,
            "version": by_name[package]["version"],
            "intended": True,
            "required_by": required_by,
            "reason": (
                f"{package} is installed at {plan['cudnn']} over the pins of the packages in required_by, "
                "on purpose (uv --override): cuDNN 9.x is ABI forward-compatible, and the pinned release "
                "carries the fix the plan needs."
            ),
        },
        "packages": packages,
        "check": {
            "expected": [e["line"] for e in check.get("expected") or []],
            "unexpected": [e["line"] for e in check.get("unexpected") or []],
            "output": check.get("output", ""),
        },
        "cudnn": facts,
        "tools": dict(tools or {}),
        "source": {
            "index_url": redact_url((source or {}).get("index_url")) if (source or {}).get("index_url") else None,
            "extra_index_urls": [redact_url(url) for url in (source or {}).get("extra_index_urls") or []],
            "find_links": list((source or {}).get("find_links") or []),
            "offline": bool((source or {}).get("offline")),
        },
    }


# --- pruning -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    name: str
    path: str
    mtime: float  # of its manifest, written once when the release was built


def scan_releases(releases_dir: str):
    """(releases newest first, leftovers, ignored) under ``releases_dir``.

    A release is a real directory (not a link) holding the manifest. Leftovers are
    ``.staging-*`` and ``.pruning-*`` directories of interrupted builds and prunes.
    Anything else is ignored: it was not made by this collection, so it is not ours to
    delete.
    """
    releases, leftovers, ignored = [], [], []
    if not os.path.isdir(releases_dir):
        return releases, leftovers, ignored
    with os.scandir(releases_dir) as entries:
        for entry in entries:
            if entry.name.startswith((STAGING_PREFIX, PRUNING_PREFIX)) and entry.is_dir(follow_symlinks=False):
                leftovers.append(entry.name)
                continue
            manifest = os.path.join(entry.path, MANIFEST_NAME)
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".") and os.path.isfile(manifest):
                releases.append(Release(entry.name, entry.path, os.lstat(manifest).st_mtime))
            else:
                ignored.append(entry.name)
    releases.sort(key=lambda r: (r.mtime, r.name), reverse=True)
    return releases, sorted(leftovers), sorted(ignored)


def read_link(root: str, link: str, releases_dir: str) -> dict:
    """Where ``<root>/<link>`` points: {path, target, release, state}.

    state: ``absent`` (no such link), ``release`` (a release directory under
    releases_dir), ``broken`` (its target does not exist) or ``outside`` (anything else).
    """
    path = os.path.join(root, link)
    info = {"path": path, "target": None, "release": None, "state": "absent"}
    if not os.path.lexists(path):
        return info
    target = os.path.realpath(path)
    info["target"] = target
    if not os.path.exists(target):
        info["state"] = "broken"
    elif os.path.dirname(target) == os.path.realpath(releases_dir) and os.path.isdir(target):
        info["state"] = "release"
        info["release"] = os.path.basename(target)
    else:
        info["state"] = "outside"
    return info


def plan_prune(releases, keep: int, protected: dict):
    """(kept, removed): every protected release, then the newest others up to ``keep`` in all.

    ``releases`` are newest first; ``protected`` maps a release name to why it stays.
    So at most max(keep, number protected) releases remain on disk.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ReleaseError(f"keep must be a whole number >= 0, not {keep!r}")
    kept, removed = [], []
    room = max(0, keep - sum(1 for r in releases if r.name in protected))
    for release in releases:
        if release.name in protected:
            kept.append((release, list(protected[release.name])))
        elif room > 0:
            room -= 1
            kept.append((release, [f"among the {keep} newest"]))
        else:
            removed.append(release)
    return kept, removed


def delete_side_by_side(directory: str, name: str, rmtree=shutil.rmtree) -> None:
    """Remove directory/name, renamed to .pruning-<name> first (unless it is a staging or
    pruning leftover already): a removal cut short never leaves a half-deleted tree that
    looks complete. Releases and staged models (module_utils/model_weights.py) both go so."""
    path = os.path.join(directory, name)
    if not name.startswith((STAGING_PREFIX, PRUNING_PREFIX)):
        doomed = os.path.join(directory, PRUNING_PREFIX + name)
        if os.path.lexists(doomed):
            rmtree(doomed)
        os.rename(path, doomed)
        path = doomed
    rmtree(path)


def prune_releases(root: str, keep: int, protect=(), links=DEFAULT_LINKS, check_mode: bool = False,
                   rmtree=shutil.rmtree) -> dict:
    """Remove old releases under ``<root>/releases``; the result of the release_prune module.

    Never removes the release a link in ``links`` points at, nor one named in
    ``protect``; keeps the newest others so that ``keep`` releases remain (see
    plan_prune); removes the leftovers of interrupted builds and prunes. In check
    mode, reports the same and removes nothing.
    """
    root = os.path.abspath(root)
    releases_dir = os.path.join(root, "releases")
    releases, leftovers, ignored = scan_releases(releases_dir)

    protected = {}
    for name in protect or ():
        protected.setdefault(str(name), []).append("protected by the caller (the release just installed)")
    link_info = {}
    for link in links or ():
        info = read_link(root, link, releases_dir)
        link_info[link] = info
        if info["release"]:
            protected.setdefault(info["release"], []).append(f"target of {link}")

    kept, removed = plan_prune(releases, keep, protected)
    if not check_mode:
        for name in [r.name for r in removed] + leftovers:
            delete_side_by_side(releases_dir, name, rmtree)

    verb = "would remove" if check_mode else "removed"
    gone = [r.name for r in removed]
    if gone or leftovers:
        message = f"{verb} {len(gone)} release(s)" + (f" ({', '.join(gone)})" if gone else "")
        if leftovers:
            message += f" and {len(leftovers)} leftover(s) of interrupted builds ({', '.join(leftovers)})"
        message += f"; {len(kept)} kept."
    else:
        message = f"nothing to prune: {len(kept)} release(s), keep {keep}."
    return {
        "changed": bool(gone or leftovers),
        "releases_dir": releases_dir,
        "kept": [{"name": r.name, "reasons": reasons} for r, reasons in kept],
        "removed": gone,
        "removed_leftovers": leftovers,
        "protected": dict(sorted(protected.items())),
        "links": link_info,
        "ignored": ignored,
        "message": message,
    }
