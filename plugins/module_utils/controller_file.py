# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""A document written on the controller (rollout reports, soak verdicts, failed
notifications): its directory made, the text replaced atomically, a list appended to the list
already there. Plain Python for the action plugin of the same name."""
from __future__ import annotations

import json
import os
import tempfile


class ControllerFileError(ValueError):
    """The file cannot be written as asked (the message names the path and why)."""


def merged(path: str, data, append: bool):
    """data, or with append the list already in path followed by data's items."""
    if not append:
        return data
    if not isinstance(data, list):
        raise ControllerFileError(f"append needs data to be a list, not {type(data).__name__}")
    try:
        with open(path, encoding="utf-8") as handle:
            known = json.load(handle)
    except FileNotFoundError:
        return data
    except (OSError, ValueError) as exc:
        raise ControllerFileError(f"{path} cannot be appended to: {exc}") from exc
    if not isinstance(known, list):
        raise ControllerFileError(f"{path} holds a {type(known).__name__}, not a list: move it away to start a new one")
    return known + data


def write(path: str, text: str, mode: int, check: bool = False) -> bool:
    """Write text to path (its directories made, 0755) unless it is already there; True if it changed."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError):
        pass  # unreadable or not text: replaced
    if check:
        return True
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        raise ControllerFileError(f"{path} cannot be written: {exc.strerror or exc}") from exc
    return True
