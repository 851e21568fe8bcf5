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

Plain Python, read-only: the release_verify module calls in here; tests/unit calls it
directly on a tree of its own.
"""

from __future__ import annotations

import base64
import csv
import glob
import hashlib
import os
import re

# Written by `uv venv` into site-packages, owned by no dist.
VENV_FILES = ("_virtualenv.py", "_virtualenv.pth")


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
