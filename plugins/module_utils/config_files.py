# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""A node's configuration as one unit of change: directories, files (from content or
copied from another file on the node) and files that must be gone, applied in one module
run instead of one copy/template/file task each (two round trips per copy). Each file is
written only when its bytes differ, to a temporary file in its own directory renamed into
place, so a reader (systemd, vLLM) never sees half a file; owner, group and mode are set
when they differ. Plain Python: tested without Ansible."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import tempfile
from dataclasses import dataclass


class ConfigFilesError(ValueError):
    """Bad input or a file that cannot be read: the message says which and what to do."""


@dataclass(frozen=True)
class Attrs:
    uid: int | None  # None only in check mode: a user an earlier task would create
    gid: int | None
    mode: int


def _lookup(table, name: str, check: bool) -> int | None:
    try:
        return table(name)
    except KeyError:
        # In check mode the role's user/group task reports "would create" without creating:
        # the file would then be written, so that is a change, not an error.
        if check:
            return None
        raise


def _attrs(entry: dict, what: str, check: bool = False) -> Attrs:
    """The entry's owner, group and mode, checked and resolved once, before any write."""
    mode = str(entry.get("mode") or "")
    # Four digits with the leading 0: an unquoted YAML 0640 arrives as 416, a valid-looking wrong mode.
    if not (len(mode) == 4 and mode[0] == "0" and all(c in "01234567" for c in mode)):
        raise ConfigFilesError(f"{what}: mode {mode!r} is not an octal mode such as '0640' (give it as a quoted string)")
    for key in ("owner", "group"):
        if not entry.get(key):
            raise ConfigFilesError(f"{what}: {key} is required")
    try:
        uid = _lookup(lambda n: pwd.getpwnam(n).pw_uid, entry["owner"], check)
    except KeyError:
        raise ConfigFilesError(f"{what}: owner {entry['owner']!r} is not a user on this node") from None
    try:
        gid = _lookup(lambda n: grp.getgrnam(n).gr_gid, entry["group"], check)
    except KeyError:
        raise ConfigFilesError(f"{what}: group {entry['group']!r} is not a group on this node") from None
    return Attrs(uid, gid, int(mode, 8))


def _set_attrs(path: str, attrs: Attrs, check: bool) -> bool:
    uid, gid = attrs.uid, attrs.gid
    st = os.lstat(path)
    changed = False
    if (st.st_uid, st.st_gid) != (uid, gid):
        changed = True
        if not check:
            os.chown(path, uid, gid)
    if stat.S_IMODE(st.st_mode) != attrs.mode:
        changed = True
        if not check:
            os.chmod(path, attrs.mode)
    return changed


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _write_atomic(path: str, data: bytes, attrs: Attrs) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".vllm-fleet-", dir=os.path.dirname(path))
    try:
        # Owner and mode before the content: a secret is never readable by others, not even briefly.
        os.fchown(fd, attrs.uid, attrs.gid)
        os.fchmod(fd, attrs.mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


KEEP = object()  # a missing source whose entry says ``if_src_missing: keep``: leave the file as it is


def _content(entry: dict, what: str):
    """The bytes the file must hold; None: it must not exist (a missing source whose entry
    says ``if_src_missing: remove``, so a copy of "no such file" is no file); KEEP."""
    if ("content" in entry and entry["content"] is not None) == bool(entry.get("src")):
        raise ConfigFilesError(f"{what}: give exactly one of content and src")
    if entry.get("src"):
        data = _read(entry["src"])
        missing = entry.get("if_src_missing", "fail")
        if data is None and missing == "keep":
            return KEEP
        if data is None and missing != "remove":
            raise ConfigFilesError(f"{what}: its source {entry['src']} does not exist on the node")
        return data
    content = entry["content"]
    return content.encode("utf-8") if isinstance(content, str) else bytes(content)


def apply(directories: list[dict] | None = None, files: list[dict] | None = None,
          absent: list[str] | None = None, check: bool = False) -> list[str]:
    """Make the node hold ``directories`` and ``files`` and not ``absent``; returns the paths
    changed (in check mode: that would change). Everything is checked (modes, users, sources)
    before the first write, so bad input changes nothing."""
    directories, files, absent = directories or [], files or [], list(absent or [])
    planned_dirs = [(d["path"], _attrs(d, f"directory {d.get('path')}", check)) for d in directories]
    planned_files = [(f["path"], _attrs(f, f"file {f.get('path')}", check), _content(f, f"file {f.get('path')}"))
                     for f in files]
    changed: list[str] = []
    for path, attrs in planned_dirs:
        if not os.path.isdir(path):
            changed.append(path)
            if not check:
                os.makedirs(path, exist_ok=True)
                _set_attrs(path, attrs, check)
        elif _set_attrs(path, attrs, check):
            changed.append(path)
    for path, attrs, data in planned_files:
        if data is KEEP:
            continue
        if data is None:
            absent.append(path)
        elif _read(path) != data:
            changed.append(path)
            if not check:
                _write_atomic(path, data, attrs)
        elif _set_attrs(path, attrs, check):
            changed.append(path)
    for path in absent:
        if os.path.lexists(path):
            changed.append(path)
            if not check:
                os.unlink(path)
    return changed
