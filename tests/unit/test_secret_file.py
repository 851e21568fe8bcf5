"""module_utils/secret_file.py, the one reader of secrets kept in files (fleet_notify's webhook
URLs and tokens, model_weights' Hub token): the checks its two callers' tests do not reach."""
from __future__ import annotations

import os

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.secret_file import SecretFileError, read_secret_file

SECRET = "s3cr3t-0123456789abcdef"


def secret(tmp_path, data: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "secret"
    path.write_bytes(data)
    os.chmod(path, mode)
    return str(path)


def read(path: str, **kwargs) -> str:
    return read_secret_file(path, "v", owner_uid=os.geteuid(), owner="me", **kwargs)


def test_a_file_of_its_owner_only_is_read_stripped(tmp_path):  # negative control for the refusals below
    assert read(secret(tmp_path, f"\n {SECRET} \n".encode())) == SECRET


def test_a_file_larger_than_the_limit_is_not_read(tmp_path):
    path = secret(tmp_path, SECRET.encode())
    assert read(path, max_bytes=len(SECRET)) == SECRET
    with pytest.raises(SecretFileError) as caught:
        read(path, max_bytes=len(SECRET) - 1)
    assert str(caught.value) == f"v: {path} is {len(SECRET)} bytes, more than {len(SECRET) - 1}: not a secret"


def test_a_file_that_is_not_utf8_is_refused_without_its_bytes(tmp_path):
    path = secret(tmp_path, b"s3cr3t\xff\xfe")
    with pytest.raises(SecretFileError, match=r"cannot be read as UTF-8 text") as caught:
        read(path)
    assert "s3cr3t" not in str(caught.value)


def test_another_owner_is_refused_naming_both(tmp_path):
    path = secret(tmp_path, SECRET.encode())
    with pytest.raises(SecretFileError) as caught:
        read_secret_file(path, "v", owner_uid=os.geteuid() + 1, owner="someone else")
    assert (f"is owned by uid {os.geteuid()}, not by someone else (uid {os.geteuid() + 1})" in str(caught.value)
            and SECRET not in str(caught.value))
