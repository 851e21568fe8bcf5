# SPDX-License-Identifier: Apache-2.0
"""Run a release's own code as an unprivileged user, never as the root that runs modules.

A release is third-party code (vLLM, torch and their wheels): its Python asked for its cuDNN,
or its `vllm bench serve` run by the soak, would otherwise run with every right on the node,
undoing what the unit's hardening keeps from it. subprocess drops to the user between fork
and exec, with the user's own group and no supplementary groups."""

from __future__ import annotations

import os
import pwd


class IdentityError(ValueError):
    pass


def as_user(name: str | None) -> dict:
    """subprocess keyword arguments that run a child as ``name`` (nothing for None).

    Raises IdentityError when the user does not exist, or when the caller is not root and
    not already that user (it could not switch)."""
    if not name:
        return {}
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise IdentityError(f"user {name!r} does not exist on this node") from None
    if os.geteuid() == entry.pw_uid:
        return {}
    if os.geteuid() != 0:
        raise IdentityError(f"cannot run as user {name!r}: this runs as uid {os.geteuid()}, not root")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
