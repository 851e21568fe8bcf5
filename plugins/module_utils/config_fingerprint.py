# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""A fingerprint of a node's service configuration (the unit, the helper, each instance's
config and environment file, the profile record, the API key file): one digest per file
over its owner, group, mode and bytes. A node records the fingerprint of the configuration
its known-good release passed with; a rollout compares it with what it would write now, so
a new API key, unit hardening or environment is rolled like a release (drain, restart,
soak), and a converged node is left alone.

Secret files (the API key) are digested with HMAC-SHA256 under a random per-node salt kept
beside the record: the record (root-only) never holds the key, and its digest cannot be
matched against a list of guessed keys prepared in advance."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets

VERSION = 1
SALT_RE = re.compile(r"^[0-9a-f]{32,128}\Z")


class FingerprintError(ValueError):
    """A file list or a recorded fingerprint that cannot be used: the message says which."""


def _digest(entry: dict, salt: bytes, secret: bool) -> str:
    try:
        attrs = f"{entry['owner']}:{entry['group']}:{entry['mode']}\n".encode()
        content = entry["content"].encode("utf-8")
        path = entry["path"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise FingerprintError(f"a file entry needs path, content, owner, group and mode (got {sorted(entry)})"
                               if isinstance(entry, dict) else f"a file entry is {type(entry).__name__}, "
                               "not a mapping") from exc
    if secret:
        return "hmac-sha256:" + hmac.new(salt, attrs + content, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(path.encode() + b"\n" + attrs + content).hexdigest()


def fingerprint(files: list[dict], secret_paths: list[str], salt: str | None = None) -> dict:
    """{version, salt, files: {path: digest}} of ``files`` (config_files' entries with
    content); the paths in ``secret_paths`` are digested with the salt (new when None)."""
    salt = salt if salt is not None else secrets.token_hex(16)
    if not isinstance(salt, str) or not SALT_RE.match(salt):
        raise FingerprintError("the salt must be 32 to 128 lowercase hex digits")
    if not isinstance(files, list):
        raise FingerprintError(f"the files are {type(files).__name__}, not a list of file entries")
    key = bytes.fromhex(salt)
    digests = {}
    for entry in files:
        digest = _digest(entry, key, entry.get("path") in secret_paths if isinstance(entry, dict) else False)
        digests[entry["path"]] = digest
    return {"version": VERSION, "salt": salt, "files": dict(sorted(digests.items()))}


def drift(files: list[dict], secret_paths: list[str], recorded: dict | None) -> list[str]:
    """The paths whose owner, group, mode or bytes differ between ``files`` (what would be
    written now) and ``recorded`` (what the known-good configuration was), files added or
    dropped included; every path when nothing (or an older format) was recorded."""
    if not recorded or not isinstance(recorded, dict) or recorded.get("version") != VERSION:
        return sorted(entry["path"] for entry in files)
    if not isinstance(recorded.get("files"), dict):
        raise FingerprintError("the recorded fingerprint has no files mapping")
    now = fingerprint(files, secret_paths, recorded.get("salt"))["files"]
    before = recorded["files"]
    return sorted(path for path in set(now) | set(before)
                  if not hmac.compare_digest(str(now.get(path, "")), str(before.get(path, ""))))
