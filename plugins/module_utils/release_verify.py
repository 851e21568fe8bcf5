# SPDX-License-Identifier: Apache-2.0
"""Re-hash an installed release: every file against the RECORD of the dist that installed it.

pip and uv write a RECORD into each ``*.dist-info`` with the sha256 of every file the
wheel put in place (scripts in ``bin/`` included), so a release venv carries its own
reference. What it checks:

- the installed set (name==version of each dist-info) is the expected one: the packages
  of the release's lock or manifest, no more, no fewer, no other version;
- every file a RECORD names with a hash still has that hash (``changed``) and exists
  (``missing``);
- every file under site-packages that no RECORD names is reported (``added``), counted
  against the dist that owns the directory it lies in. Byte code (``__pycache__``, which
  Python writes on import) and the files ``uv venv`` itself writes are left out.

check_release() adds, for the role's verify of one release in one module run, the parsed
manifest, the cuDNN facts of the release (module_utils/cudnn.py) and the version of vllm
its own Python imports (vllm_version()), both run as an unprivileged user.

Why not ``bin/vllm --version``: in vLLM 0.25.1 it builds every subcommand's parser before it
reads ``--version`` (vllm/entrypoints/cli/main.py lines 85-90: ``cmd_init``/``subparser_init``,
then ``parse_args``); ``serve``'s parser (vllm/entrypoints/cli/serve.py line 164,
``make_arg_parser``) computes EngineArgs' defaults, among them a DeviceConfig whose
``__post_init__`` raises "Failed to infer device type" when the platform is unspecified
(vllm/config/device.py lines 49-59; vllm/engine/arg_utils.py line 311). The platform is CUDA
only when NVML initialises and counts a GPU (cuda_platform_plugin, vllm/platforms/__init__.py
lines 59-107); otherwise, and with no other platform, it is UnspecifiedPlatform, whose
device_type is "" (vllm/platforms/interface.py line 1279). So ``vllm --version`` works on a GPU
node whose driver is loaded, and fails (exit 1) on a CPU machine (run here, 2026-12-07), on a GPU
node whose driver is not loaded (NVMLError_DriverNotLoaded: an NVML error, swallowed there,
leaves the platform unspecified) and where the probe user may not open the device nodes
(NVMLError_NoPermission, the same): a release check that would judge the driver and EngineArgs
rather than the release. vllm_version() asks the release's Python instead, which needs neither.

Plain Python, read-only: the release_verify module calls in here; tests/unit calls it
directly on a tree of its own.
"""

from __future__ import annotations

import base64
import csv
import functools
import glob
import hashlib
import json
import os
import re
import subprocess

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.identity import IdentityError, as_user, run_probe
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import MANIFEST_NAME, ReleaseError, parse_lock

# Written by `uv venv` into site-packages, owned by no dist.
VENV_FILES = ("_virtualenv.py", "_virtualenv.pth")
# What check_release() can run of the release's own code.
PROBES = ("cudnn", "vllm_version")


class VerifyError(ValueError):
    """A venv that cannot be verified at all (no site-packages, an unreadable RECORD)."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def site_packages(venv: str) -> str:
    """``<venv>/lib/pythonX.Y/site-packages``; VerifyError when there is not exactly one."""
    found = sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages")))
    if len(found) != 1:
        raise VerifyError(f"{venv} is not a venv with one site-packages (found {len(found)}: {found})")
    return found[0]


def record_hash(path: str) -> str:
    """The RECORD form of a file's sha256: ``sha256=<urlsafe base64, no padding>``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _metadata(dist_info: str) -> tuple:
    name = version = None
    with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                break  # the headers end at the first blank line
            key, value = line.split(":", 1) if ":" in line else (line, "")
            if key == "Name":
                name = value.strip()
            elif key == "Version":
                version = value.strip()
    if not name or not version:
        raise VerifyError(f"{dist_info}/METADATA has no Name or Version")
    return _canonical(name), version


def installed_dists(site: str) -> dict:
    """{canonical name: {version, dist_info, record}} of every dist installed in ``site``."""
    dists = {}
    for dist_info in sorted(glob.glob(os.path.join(site, "*.dist-info"))):
        name, version = _metadata(dist_info)
        dists[name] = {"version": version, "dist_info": dist_info, "record": os.path.join(dist_info, "RECORD")}
    return dists


def read_record(record: str, site: str, venv: str) -> list:
    """[(path relative to the venv, hash or '')] from one RECORD; paths resolved from site-packages."""
    try:
        with open(record, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise VerifyError(f"cannot read {record}: {exc.strerror}") from None
    entries = []
    for row in rows:
        if not row or not row[0]:
            continue
        path = os.path.normpath(os.path.join(site, row[0]))
        rel = os.path.relpath(path, venv)
        if rel.startswith(".."):
            raise VerifyError(f"{record} names {row[0]!r}, outside the venv {venv}")
        entries.append((rel, row[1] if len(row) > 1 else ""))
    return entries


def compare_sets(expected, installed: dict) -> dict:
    """{missing, extra, other_version}: ``expected`` [{name, version}] against installed_dists()."""
    want = {_canonical(p["name"]): str(p["version"]) for p in expected}
    have = {name: info["version"] for name, info in installed.items()}
    return {
        "missing": sorted(f"{n}=={v}" for n, v in want.items() if n not in have),
        "extra": sorted(f"{n}=={v}" for n, v in have.items() if n not in want),
        "other_version": sorted(f"{n}: {want[n]} expected, {have[n]} installed"
                                for n in want.keys() & have.keys() if want[n] != have[n]),
    }


def _unrecorded(site: str, venv: str, recorded: set) -> list:
    found = []
    for top, dirs, files in os.walk(site):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(top, name), venv)
            if rel not in recorded and not (top == site and name in VENV_FILES):
                found.append(rel)
    return found


def _owner(rel: str, owners: dict) -> str:
    """The dist owning the deepest directory of ``rel`` that only one dist writes into."""
    parent = os.path.dirname(rel)
    while parent:
        if parent in owners and len(owners[parent]) == 1:
            return next(iter(owners[parent]))
        parent = os.path.dirname(parent)
    return "(no dist)"


def verify_venv(venv: str, expected) -> dict:
    """Re-hash the release venv ``venv`` and compare its dists with ``expected`` [{name, version}].

    Returns {ok, packages (compare_sets), files {dist: {changed, missing, added}}, checked
    (files re-hashed), message}. Reads only.
    """
    venv = os.path.abspath(venv)
    site = site_packages(venv)
    installed = installed_dists(site)
    packages = compare_sets(expected, installed)
    files, recorded, owners, checked = {}, set(), {}, 0
    site_rel = os.path.relpath(site, venv)
    for name, info in sorted(installed.items()):
        drift = {"changed": [], "missing": [], "added": []}
        for rel, digest in read_record(info["record"], site, venv):
            recorded.add(rel)
            if rel.startswith(site_rel + os.sep):  # which dists write into each directory
                parent = os.path.dirname(rel)
                while parent != site_rel:
                    owners.setdefault(parent, set()).add(name)
                    parent = os.path.dirname(parent)
            if not digest:
                continue  # RECORD itself, byte code: no hash to check
            path = os.path.join(venv, rel)
            if not os.path.lexists(path):
                drift["missing"].append(rel)
            elif record_hash(path) != digest:
                drift["changed"].append(rel)
            checked += 1
        files[name] = drift
    for rel in _unrecorded(site, venv, recorded):
        files.setdefault(_owner(rel, owners), {"changed": [], "missing": [], "added": []})["added"].append(rel)
    files = {name: {what: sorted(paths) for what, paths in drift.items()}
             for name, drift in sorted(files.items()) if any(drift.values())}

    problems = [f"{what} {', '.join(items)}" for what, items in (
        ("dists missing:", packages["missing"]), ("dists not expected:", packages["extra"]),
        ("other versions:", packages["other_version"])) if items]
    for name, drift in files.items():
        parts = [f"{what} {', '.join(drift[what])}" for what in ("changed", "missing", "added") if drift[what]]
        problems.append(f"{name}: " + "; ".join(parts))
    ok = not problems
    message = (f"{venv}: {len(installed)} dists as expected, {checked} files match their RECORD hashes" if ok
               else f"{venv} drifted from what was installed: " + " | ".join(problems))
    return {"ok": ok, "packages": packages, "files": files, "checked": checked, "message": message}


def read_manifest(path: str) -> tuple:
    """(the manifest at ``path`` as a dict, None), or (None, why it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return None, f"no manifest {path} (not installed, or its build did not finish)"
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror}"
    except ValueError as exc:
        return None, f"{path} is not JSON: {exc}"
    if not isinstance(manifest, dict):
        return None, f"{path} holds a {type(manifest).__name__}, not a JSON object"
    return manifest, None


# Run by the release's Python (-I: no PYTHONPATH, no user site): import vllm, as the server does
# (vllm/__init__.py takes __version__ from vllm/version.py and imports torch through
# vllm.env_override), and read the installed dist's version (importlib.metadata, which
# `vllm --version` prints). No GPU, driver or engine configuration is involved.
VERSION_PROBE = (
    "import importlib.metadata, json, os, vllm\n"
    "print(json.dumps({'version': getattr(vllm, '__version__', None), 'metadata': importlib.metadata.version('vllm'),"
    " 'module': os.path.realpath(vllm.__file__)}))\n"
)


def vllm_version(venv: str, timeout: int = 60, run=subprocess.run) -> dict:
    """{version, metadata, module, error}: ``vllm.__version__`` as the release's Python imports
    it, the installed dist's version, and the file imported; ``error`` says why there are none,
    or that vllm was imported from outside the release. ``run`` may be bound by as_user()."""
    python = os.path.join(venv, "bin", "python")
    what = f"{python} importing vllm"
    out, error = run_probe(run, [python, "-I", "-c", VERSION_PROBE], timeout, what)
    result = {"version": None, "metadata": None, "module": None, "error": error}
    if error:
        return result
    try:
        found = json.loads(out.strip().splitlines()[-1])
        result.update({key: found[key] for key in ("version", "metadata", "module")})
    except (ValueError, KeyError, IndexError, TypeError):
        return {**result, "error": f"{what} printed no version: {out.strip()[-200:]!r}"}
    inside = os.path.realpath(venv) + os.sep
    if not str(result["module"]).startswith(inside):
        result["error"] = f"{what} imported {result['module']}, which is not in the release ({inside})"
    return result


def check_release(path: str, *, lock: str | None = None, missing_ok: bool = False, rehash: bool = True,
                  probes=(), user: str | None = None, timeout: int = 60, run=subprocess.run) -> dict:
    """Everything the role judges of one release, read in one go.

    Returns {installed (its manifest exists), manifest (dict or None), manifest_error,
    verify (verify_venv(), or None when not asked or nothing to compare with), cudnn
    (collect_cudnn_facts() or None), vllm_version (vllm_version() or None), message}.
    The expected dists come from ``lock``, else from the manifest; without either,
    ReleaseError, or with ``missing_ok`` a result that says why and has run nothing.
    ``probes`` (of PROBES) run the release's code as ``user``. Reads only.
    """
    path = os.path.abspath(path)
    manifest_path = os.path.join(path, MANIFEST_NAME)
    manifest, manifest_error = read_manifest(manifest_path)
    result = {"installed": os.path.lexists(manifest_path), "manifest": manifest, "manifest_error": manifest_error,
              "verify": None, "cudnn": None, "vllm_version": None}
    if lock:
        with open(lock, encoding="utf-8") as handle:
            expected = parse_lock(handle.read())
    else:
        expected = manifest.get("packages") if manifest is not None else None
        if manifest is not None and (not isinstance(expected, list) or not expected):
            expected = None
            result["manifest_error"] = f"{manifest_path} lists no packages: it was not written by the vllm_runtime role"
    if expected is None:
        if not missing_ok:
            raise ReleaseError(result["manifest_error"])
        # Not a complete release: none of its code is run.
        result["message"] = f"{path} was not verified: {result['manifest_error']}"
        return result

    unknown = sorted(set(probes) - set(PROBES))
    if unknown:
        raise ValueError(f"unknown probes {unknown}: choose from {', '.join(PROBES)}")
    if "cudnn" in probes:
        # Here, not at the top: cudnn.py needs packaging, the re-hash alone does not.
        from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import CudnnFactsError, collect_cudnn_facts

        try:
            result["cudnn"] = collect_cudnn_facts(path, timeout=timeout, run=run, user=user)
        except CudnnFactsError as exc:  # not a venv, its Python gone, no such user
            raise VerifyError(str(exc)) from None
    if "vllm_version" in probes:
        try:
            as_probe_user = functools.partial(run, **as_user(user))
        except IdentityError as exc:
            raise VerifyError(f"cannot run {path}/bin/python as another user: {exc}") from None
        result["vllm_version"] = vllm_version(path, timeout=timeout, run=as_probe_user)
    # After the probes: the re-hash also sees what the release's code changed while it ran.
    if rehash:
        result["verify"] = verify_venv(path, expected)

    said = [result["verify"]["message"]] if result["verify"] else [f"{path}: manifest read"]
    if result["cudnn"]:
        said.append(result["cudnn"]["message"])
    if result["vllm_version"]:
        version = result["vllm_version"]
        said.append(version["error"] or f"its Python imports vllm {version['version']} (dist {version['metadata']})")
    result["message"] = "; ".join(said)
    return result
