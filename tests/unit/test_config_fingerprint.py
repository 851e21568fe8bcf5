"""The configuration fingerprint (module_utils/config_fingerprint.py): what a rollout
compares to decide that a node's unit, environment or API key changed since its known-good
release passed, and never a copy of the key."""
from __future__ import annotations

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.config_fingerprint import (
    FingerprintError,
    drift,
    fingerprint,
)

KEY_FILE = "/etc/vllm-fleet/api-key.env"
KEY = "old-key-0123456789abcdef"


def files(key: str = KEY, unit: str = "[Service]\nRestartSec=10\n", mode: str = "0644") -> list[dict]:
    return [
        {"path": "/etc/systemd/system/vllm@.service", "content": unit, "owner": "root", "group": "root", "mode": mode},
        {"path": "/etc/vllm-fleet/gpu0.yaml", "content": "port: 8000\n", "owner": "root", "group": "vllm",
         "mode": "0640"},
        {"path": KEY_FILE, "content": f'VLLM_API_KEY="{key}"\n', "owner": "root", "group": "root", "mode": "0600"},
    ]


def test_the_record_holds_digests_and_never_the_key():
    record = fingerprint(files(), [KEY_FILE])
    assert set(record) == {"version", "salt", "files"} and len(record["files"]) == 3
    assert KEY not in repr(record)
    assert record["files"][KEY_FILE].startswith("hmac-sha256:")
    # A new salt each time: the same key gives an unrelated digest (no dictionary of keys).
    assert fingerprint(files(), [KEY_FILE])["files"][KEY_FILE] != record["files"][KEY_FILE]


def test_the_same_configuration_has_no_drift():
    record = fingerprint(files(), [KEY_FILE])
    assert drift(files(), [KEY_FILE], record) == []


@pytest.mark.parametrize("changed, path", [
    (dict(key="new-key-0123456789abcdef"), KEY_FILE),  # a rotated key
    (dict(unit="[Service]\nRestartSec=7\n"), "/etc/systemd/system/vllm@.service"),  # new hardening
    (dict(mode="0664"), "/etc/systemd/system/vllm@.service"),  # attributes count too
])
def test_each_change_is_named(changed, path):
    record = fingerprint(files(), [KEY_FILE])
    assert drift(files(**changed), [KEY_FILE], record) == [path]


def test_an_added_or_dropped_file_is_drift():
    record = fingerprint(files(), [KEY_FILE])
    assert drift(files()[:2], [KEY_FILE], record) == [KEY_FILE]  # the key removed
    assert drift(files() + [{**files()[1], "path": "/etc/vllm-fleet/gpu1.yaml"}], [KEY_FILE], record) == \
        ["/etc/vllm-fleet/gpu1.yaml"]


def test_a_node_with_no_record_has_every_path_drifted():
    """Marked known-good before records were kept: what it serves was never proven."""
    paths = sorted(entry["path"] for entry in files())
    assert drift(files(), [KEY_FILE], None) == paths
    assert drift(files(), [KEY_FILE], {"version": 0, "files": {}}) == paths


@pytest.mark.parametrize("salt", ["", "xyz", "AB" * 16, 5])
def test_a_bad_salt_is_refused(salt):
    with pytest.raises(FingerprintError, match="salt"):
        fingerprint(files(), [KEY_FILE], salt)


def test_a_malformed_entry_is_named():
    with pytest.raises(FingerprintError, match="needs path, content, owner, group and mode"):
        fingerprint([{"path": "/x", "content": "y"}], [])
