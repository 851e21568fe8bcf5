# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""One read of what a node is and serves: its GPU, the cuDNN of the serving release, where
`current` and `known-good` point, the profiles recorded with them and any soak an
interrupted rollout left running. A rollout reads it once per node and judges, selects and
skips from it (the node_state module)."""
from __future__ import annotations

import json
import os

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import (
    VenvNotFoundError,
    absent_venv_facts,
    collect_cudnn_facts,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.gpu import collect_gpu_facts
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stop import orphans

# The links under the root, named as the state reports them.
LINKS = {"current": "current", "known_good": "known-good"}


class NodeStateError(Exception):
    """A recorded file that cannot be read: the message names it and says why."""


def link_target(path: str) -> str:
    """The release a link points at (its last path component), '' when it is no link."""
    return os.path.basename(os.path.realpath(path)) if os.path.islink(path) else ""


def recorded(path: str, what: str = "a recorded profile") -> dict:
    """The JSON object recorded at ``path`` ({} when there is none yet)."""
    try:
        with open(path, encoding="utf-8") as handle:
            profile = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise NodeStateError(f"{path} cannot be read as {what}: {exc}") from exc
    if not isinstance(profile, dict):
        raise NodeStateError(f"{path} holds {type(profile).__name__}, not {what} (a JSON object)")
    return profile


def read_node_state(root: str, config_dir: str, timeout: int = 60, probe_cudnn: bool = True,
                    gpu=collect_gpu_facts, cudnn=collect_cudnn_facts, user: str | None = None) -> tuple[dict, dict]:
    """(GPU facts, node state) of this node; the GPU facts are gpu_facts' vllm_fleet_gpu.
    Without ``probe_cudnn`` cudnn_current is None: a rollback must not depend on the venv
    it leaves being able to run. ``user`` runs the venv's code (cudnn_facts)."""
    current = os.path.join(root, "current")
    cudnn_current = None
    if probe_cudnn:
        try:
            cudnn_current = cudnn(current, timeout=timeout, user=user)
        except VenvNotFoundError:  # a node that serves nothing yet
            cudnn_current = absent_venv_facts(current)
    state = {
        "cudnn_current": cudnn_current,
        "links": {name: link_target(os.path.join(root, link)) for name, link in LINKS.items()},
        "profile": recorded(os.path.join(config_dir, "profile.json")),
        "known_good_profile": recorded(os.path.join(config_dir, "known-good", "profile.json")),
        # vllm_service's record of the configuration known-good passed with (config_fingerprint).
        "known_good_fingerprint": recorded(os.path.join(config_dir, "known-good", "fingerprint.json"),
                                           "a recorded configuration fingerprint"),
        # Where the soak module writes (soak_gate: <root>/current/soak/<run>-<instance>); a
        # rollout's turn stops these (soak_stop) only when there are any.
        "soaks_left": orphans(os.path.join(current, "soak")),
    }
    return gpu(), state
