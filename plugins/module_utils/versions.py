# SPDX-License-Identifier: Apache-2.0
"""Version helpers shared by the facts modules and the catalogue.

Versions are compared with ``packaging`` (PEP 440), never as strings: '9.9' < '9.19'.
Plain Python; ``packaging`` is the one third-party import.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def parse_version(text, what: str) -> Version:
    """Parse ``text`` as a PEP 440 version; ``what`` names it in the error."""
    try:
        return Version(str(text).strip())
    except InvalidVersion:
        raise ValueError(f"{what}: {str(text)!r} is not a version (PEP 440, e.g. '9.24.0.43')") from None


def release_string(version, what: str, parts: int = 3) -> str:
    """The first ``parts`` release numbers, zero-padded: '9.24.0.43' -> '9.24.0', '9.24' -> '9.24.0'."""
    release = parse_version(version, what).release
    return ".".join(str(n) for n in (release + (0,) * parts)[:parts])


def cudnn_int_to_version(value) -> str:
    """cudnnGetVersion()'s number as a version: 92400 -> '9.24.0', 8907 -> '8.9.7'.

    cuDNN 9 encodes MAJOR*10000 + MINOR*100 + PATCH; cuDNN 8 and older used
    MAJOR*1000 + MINOR*100 + PATCH, which torch builds against cuDNN 8 still report.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"cuDNN version number: {value!r} is not a positive integer")
    major_unit = 10000 if value >= 90000 else 1000
    major, rest = divmod(value, major_unit)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"
