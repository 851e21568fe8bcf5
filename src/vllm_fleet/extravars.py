"""``--extra-vars`` values parsed the way ansible-playbook reads them, checked up front.

ansible-playbook accepts ``key=value`` pairs, inline JSON/YAML, and ``@file``; a bad value
there fails the run late and far from the typo. Here it is a usage error that names it.

YAML (``@file`` and inline) is read with the collection's strict loader
(``plugins/module_utils/strict_yaml.py``, plain Python), the one that reads the catalogue and
the profiles: no anchors or aliases (a 386-byte alias bomb expanded to 351 MB of JSON under
``yaml.safe_load``), no duplicate keys, at most 1 MiB.

Names beginning with ``_`` are the roles' own variables (results and checks); extra vars win
over every other variable in Ansible, so one given here could switch a check off: refused.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path
from typing import Any

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STRICT_YAML = Path("plugins") / "module_utils" / "strict_yaml.py"


class ExtraVarsError(ValueError):
    """A value of --extra-vars that ansible-playbook would not read as variables."""


def strict_loader(project_dir: Path):
    """The collection's strict_yaml module, loaded by path from the project the CLI runs."""
    path = project_dir / STRICT_YAML
    spec = importlib.util.spec_from_file_location("vllm_fleet_strict_yaml", path)
    if spec is None or not path.is_file():
        raise ExtraVarsError(f"--extra-vars: {path} is missing: is {project_dir} a vllm-fleet checkout?")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mapping(value: Any, source: str) -> dict:
    if not isinstance(value, dict):
        kind = "nothing" if value is None else type(value).__name__
        raise ExtraVarsError(f"--extra-vars {source}: expected a mapping of variables, got {kind}")
    bad = [k for k in value if not isinstance(k, str) or not _KEY.match(k)]
    if bad:
        raise ExtraVarsError(f"--extra-vars {source}: {bad[0]!r} is not a valid variable name")
    for key in value:
        _not_private(key, source)
    return value


def _not_private(key: str, source: str) -> None:
    if key.startswith("_"):
        raise ExtraVarsError(
            f"--extra-vars {source}: {key!r} begins with '_': such names are the roles' own (their "
            "checks and results), and -e would override them; set the documented vllm_fleet_* variable instead")


def _json_safe(value: dict, source: str) -> dict:
    """Round-trip through JSON: ansible-runner hands extra vars to Ansible as JSON, and YAML
    can hold values JSON cannot (dates become ISO strings, as Ansible would template them)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError) as exc:  # e.g. a float NaN key, a cyclic alias
        raise ExtraVarsError(f"--extra-vars {source}: cannot be passed on as JSON ({exc})") from None


def parse_one(raw: str, project_dir: Path, cwd: Path | None = None) -> dict:
    """One -e value: ``@file`` (YAML or JSON), inline JSON/YAML (``{...}``), or ``k=v ...``;
    YAML read by project_dir's strict loader."""
    shown = repr(raw if len(raw) <= 80 else raw[:77] + "...")
    text = raw.strip()
    if not text:
        raise ExtraVarsError(f"--extra-vars {shown}: empty value")
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        if cwd is not None and not path.is_absolute():
            path = cwd / path
        if not path.is_file():
            raise ExtraVarsError(f"--extra-vars {shown}: no such file {str(path)!r}")
        strict = strict_loader(project_dir)
        try:
            loaded = strict.load_file(str(path))
        except strict.StrictYAMLError as exc:
            raise ExtraVarsError(f"--extra-vars {shown}: cannot read {str(path)!r}: {_first_line(exc)}") from None
        return _json_safe(_mapping(loaded, shown), shown)
    if text[0] in "{[":
        strict = strict_loader(project_dir)
        try:
            loaded = strict.loads(text, source="the value")
        except strict.StrictYAMLError as exc:
            raise ExtraVarsError(f"--extra-vars {shown}: not valid JSON/YAML: {_first_line(exc)}") from None
        return _json_safe(_mapping(loaded, shown), shown)
    try:
        tokens = shlex.split(text)
    except ValueError as exc:  # unbalanced quotes
        raise ExtraVarsError(f"--extra-vars {shown}: {exc}") from None
    result = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not _KEY.match(key):
            raise ExtraVarsError(
                f"--extra-vars {shown}: {token!r} is not key=value "
                "(give key=value pairs, inline JSON/YAML like '{\"key\": 1}', or @file)")
        _not_private(key, shown)
        result[key] = value  # ansible-playbook keeps k=v values as strings too
    return result


def _file_of(raw: str, cwd: Path | None) -> Path | None:
    text = raw.strip()
    if not text.startswith("@"):
        return None
    path = Path(text[1:]).expanduser()
    return cwd / path if cwd is not None and not path.is_absolute() else path


def is_vaulted(path: Path) -> bool:
    """A vault-encrypted file, or YAML with inline ``!vault`` values: only ansible-playbook,
    with the vault secrets, can read it."""
    try:
        head = path.read_bytes()[:1024 * 1024]
    except OSError:
        return False
    return head.lstrip().startswith(b"$ANSIBLE_VAULT;") or b"!vault" in head


def vault_files(values: list[str] | None, cwd: Path | None = None) -> list[Path]:
    """The ``-e @file`` values that are vaulted, in order: passed on to ansible-playbook as
    ``-e @<absolute path>`` (a path, never the secret), not read here."""
    out = []
    for raw in values or []:
        path = _file_of(raw, cwd)
        if path is not None and path.is_file() and is_vaulted(path):
            out.append(path.resolve())
    return out


def parse_extra_vars(values: list[str] | None, *, project_dir: Path, cwd: Path | None = None,
                     reserved: dict[str, str] | None = None) -> dict:
    """Merge every -e value in order; a later one replaces a top-level key, as in Ansible.
    project_dir is the checkout whose strict YAML loader reads the values; reserved maps
    variable names the CLI sets itself to the option to use instead."""
    merged: dict = {}
    vaulted = set(vault_files(values, cwd))
    for raw in values or []:
        path = _file_of(raw, cwd)
        if path is not None and path.is_file() and path.resolve() in vaulted:
            continue  # ansible-playbook decrypts it (vault_files)
        merged.update(parse_one(raw, project_dir, cwd))
    for name, instead in (reserved or {}).items():
        if name in merged:
            raise ExtraVarsError(f"--extra-vars: {name} is set by vllm-fleet itself; use {instead}")
    return merged


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
