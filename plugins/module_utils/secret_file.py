# SPDX-License-Identifier: Apache-2.0
"""A secret read from a file only its owner can read: fleet_notify's webhook URLs and tokens
(on the controller, owned by the user that runs Ansible) and model_weights' Hugging Face token
(on a node, owned by root). One set of checks for both; each message names the variable and
the path, never the secret.

Plain Python (no ``ansible`` import): the notify filter and the model_weights module call it.
"""

from __future__ import annotations

import os
import stat

MAX_BYTES = 65536


class SecretFileError(ValueError):
    """The file cannot be read, or is not kept as a secret must be."""


def read_secret_file(path: str, what: str, *, owner_uid: int, owner: str, max_bytes: int = MAX_BYTES) -> str:
    """The file's text, stripped. ``what`` names the variable that gave ``path``; the file must be
    a regular file of ``owner`` (uid ``owner_uid``), mode 0600 or 0400, UTF-8, not empty and at
    most ``max_bytes``."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise SecretFileError(f"{what}: {path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SecretFileError(f"{what}: {path} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077 or not mode & 0o400:
        raise SecretFileError(f"{what}: {path} is mode {mode:04o}; it must be readable by its owner only "
                              f"(0600 or 0400): it holds a secret. Fix it with: chmod 0600 {path}")
    if info.st_uid != owner_uid:
        raise SecretFileError(f"{what}: {path} is owned by uid {info.st_uid}, not by {owner} (uid {owner_uid}); "
                              "it must be that user's own, mode 0600 or 0400")
    if info.st_size > max_bytes:
        raise SecretFileError(f"{what}: {path} is {info.st_size} bytes, more than {max_bytes}: not a secret")
    try:
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"{what}: {path} cannot be read as UTF-8 text: {exc}") from None
    if not value:
        raise SecretFileError(f"{what}: {path} is empty")
    return value
