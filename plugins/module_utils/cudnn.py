# SPDX-License-Identifier: Apache-2.0
"""cuDNN facts of a Python venv, learned by running the venv's own interpreter.

Nothing is imported into the caller: the venv may hold another Python, and a broken
libcudnn can abort whoever calls it. So each question is its own subprocess of
``<venv>/bin/python``, and one failing cannot hide the others' answers:

1. which cuDNN wheels, torch and vllm are installed (importlib.metadata);
2. what the wheel's libcudnn.so.9 reports (ctypes, cudnnGetVersion);
3. what torch actually loads (torch.backends.cudnn.version()), the one that serves.

The result has the shape of ``cudnn`` in docs/CONTRACTS.md.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.identity import as_user, last_line, run_probe
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.versions import (
    cudnn_int_to_version,
    release_string,
)

# Preference order when both are installed (they share nvidia/cudnn/lib): vLLM
# >= 0.21 is a CUDA 13 build.
CUDNN_WHEELS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
LIBRARY = "libcudnn.so.9"

_LIST_PROBE = """
import importlib.metadata as md, json, os, sys
library, names = sys.argv[1], sys.argv[2:]
found = {}
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    lib = next((f for f in dist.files or () if f.name == library), None)
    path = os.path.normpath(str(dist.locate_file(lib))) if lib else None
    found[name] = {"version": dist.version, "library_path": path}
print(json.dumps(found))
"""

_LIBRARY_PROBE = """
import ctypes, sys
get_version = ctypes.CDLL(sys.argv[1]).cudnnGetVersion
get_version.restype = ctypes.c_size_t
get_version.argtypes = []
print(get_version())
"""

_TORCH_PROBE = """
import json, torch
print(json.dumps(torch.backends.cudnn.version()))
"""


class CudnnFactsError(Exception):
    """The venv cannot be probed at all (missing, not a venv, its Python broken)."""


class VenvNotFoundError(CudnnFactsError):
    """The venv path does not exist."""


def _facts(venv: str, python: str | None) -> dict:
    return {
        "venv": venv,
        "python": python,
        "wheels": [],
        "library_path": None,
        "library_version": None,
        "library_version_raw": None,
        "library_error": None,
        "torch_version": None,
        "torch_cudnn_version": None,
        "torch_cudnn_version_raw": None,
        "torch_error": None,
        "vllm_version": None,
        "effective_version": None,
        "effective_source": None,
        "mismatch": False,
        "mismatch_detail": None,
        "status": None,
        "message": None,
    }


def absent_venv_facts(venv: str) -> dict:
    """The facts of a venv that does not exist (status ``no_venv``)."""
    venv = os.path.abspath(venv)
    facts = _facts(venv, None)
    facts["status"] = "no_venv"
    facts["message"] = f"There is no venv at {venv}, so there is no cuDNN to report."
    return facts


def _venv_python(venv: str) -> str:
    if not os.path.lexists(venv):
        raise VenvNotFoundError(f"venv {venv} does not exist")
    if not os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        raise CudnnFactsError(
            f"{venv} is not a venv: it has no pyvenv.cfg (create it with 'uv venv' or 'python -m venv')"
        )
    python = os.path.join(venv, "bin", "python")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise CudnnFactsError(
            f"venv {venv} has no usable Python: {python} is missing or not executable"
            " (was its base interpreter removed?); recreate the venv"
        )
    return python


def _probe(run, python: str, script: str, args: list, timeout: int, what: str):
    """Run one probe; returns (last line of stdout, None) or (None, error sentence)."""
    # -I: no PYTHON* variables, no user site, no cwd on sys.path; only the venv answers.
    out, error = run_probe(run, [python, "-I", "-c", script, *args], timeout, what)
    # Whole: the listing's JSON grows with the venv's path (only error text is cut short).
    return (None, error) if error else (last_line(out, limit=None), None)


def _list_installed(run, python: str, venv: str, timeout: int) -> dict:
    out, error = _probe(run, python, _LIST_PROBE, [LIBRARY, *CUDNN_WHEELS, "torch", "vllm"], timeout, "listing")
    if error is None:
        try:
            return json.loads(out)
        except ValueError:
            error = f"listing printed {out!r}, not JSON"
    raise CudnnFactsError(f"cannot list the packages of venv {venv} with {python}: {error}")


def _cudnn_version(run, python: str, script: str, args: list, timeout: int, what: str):
    """(raw number, 'M.m.p', None) or (None, None, error) from a probe printing cudnnGetVersion."""
    out, error = _probe(run, python, script, args, timeout, what)
    if error:
        return None, None, error
    try:
        raw = json.loads(out)
    except ValueError:
        raw = out
    if raw is None:
        return None, None, f"{what} returned None: no cuDNN is available to it"
    try:
        return raw, cudnn_int_to_version(raw), None
    except ValueError:
        return None, None, f"{what} printed {out!r}, not a cuDNN version number"


def collect_cudnn_facts(venv: str, timeout: int = 60, run=subprocess.run, user: str | None = None) -> dict:
    """The cuDNN facts of ``venv`` (docs/CONTRACTS.md); ``timeout`` bounds each probe, and
    ``user`` runs them (the venv's code) as that user instead of the caller.

    Raises VenvNotFoundError for a path that does not exist and CudnnFactsError for
    one that is not a usable venv or a user that cannot run it. Failing library or torch
    probes are reported in ``library_error`` / ``torch_error``, never raised.
    """
    venv = os.path.abspath(venv)
    python = _venv_python(venv)
    try:
        run = functools.partial(run, **as_user(user))
    except ValueError as exc:
        raise CudnnFactsError(f"cannot probe venv {venv} as another user: {exc}") from None
    installed = _list_installed(run, python, venv, timeout)
    facts = _facts(venv, python)

    facts["wheels"] = [{"name": name, **installed[name]} for name in CUDNN_WHEELS if name in installed]
    wheel = facts["wheels"][0] if facts["wheels"] else None
    if wheel and wheel["library_path"]:
        facts["library_path"] = wheel["library_path"]
        facts["library_version_raw"], facts["library_version"], facts["library_error"] = _cudnn_version(
            run, python, _LIBRARY_PROBE, [wheel["library_path"]], timeout, f"loading {wheel['library_path']}"
        )
    if "torch" in installed:
        facts["torch_version"] = installed["torch"]["version"]
        facts["torch_cudnn_version_raw"], facts["torch_cudnn_version"], facts["torch_error"] = _cudnn_version(
            run, python, _TORCH_PROBE, [], timeout, "torch.backends.cudnn.version()"
        )
    if "vllm" in installed:
        facts["vllm_version"] = installed["vllm"]["version"]

    _judge(facts)
    return facts


def _judge(facts: dict) -> None:
    """Fill effective_version, mismatch and status from what the probes found.

    Every cuDNN wheel counts: cu12 and cu13 share nvidia/cudnn/lib, so the library is
    whichever was installed last, and comparing only one wheel would make the verdict
    depend on the install order."""
    wheel = facts["wheels"][0] if facts["wheels"] else None
    # (source, M.m.p, what it says), in the order that effective_version prefers.
    known = []
    if facts["torch_cudnn_version"]:
        version = facts["torch_cudnn_version"]
        known.append(("torch", version, f"torch {facts['torch_version']} loads cuDNN {version}"))
    if facts["library_version"]:
        version = facts["library_version"]
        known.append(("library", version, f"{LIBRARY} reports {version}"))
    for each in facts["wheels"]:
        release = release_string(each["version"], f"{each['name']} version")
        known.append(("wheel", release, f"the {each['name']} wheel is {each['version']}"))

    venv = facts["venv"]
    if not known:
        facts["status"] = "no_cudnn"
        facts["message"] = f"No cuDNN in {venv}: neither {' nor '.join(CUDNN_WHEELS)} is installed"
        if facts["torch_error"]:
            facts["message"] += f", and torch {facts['torch_version']} reports none ({facts['torch_error']})"
        facts["message"] += "."
        return

    source, effective, _ = known[0]
    facts["effective_source"], facts["effective_version"] = source, effective
    facts["mismatch"] = len({release for _, release, _ in known}) > 1
    how = {
        "torch": "as torch loads it",
        "library": f"as {LIBRARY} reports it",
        "wheel": f"the wheel's version; {facts['library_error'] or f'the wheel has no {LIBRARY}'}",
    }[source]
    if facts["mismatch"]:
        # The wheels first (in CUDNN_WHEELS order), then the library, then torch.
        said = [s for src, _, s in known if src == "wheel"] + [s for src, _, s in reversed(known) if src != "wheel"]
        facts["mismatch_detail"] = "cuDNN versions disagree: " + ", ".join(said) + "."
        facts["status"] = "mismatch"
        facts["message"] = f"{facts['mismatch_detail']} Effective in {venv}: cuDNN {effective} ({how})."
    elif source != "torch":
        facts["status"] = "no_torch"
        if facts["torch_version"]:
            why = f"torch {facts['torch_version']} could not report the cuDNN it loads: {facts['torch_error']}"
        else:
            why = "torch is not installed, so nothing has loaded it"
        facts["message"] = f"cuDNN {effective} in {venv} ({how}), but {why}."
    else:
        facts["status"] = "ok"
        origin = f" from {wheel['name']} {wheel['version']}" if wheel else ""
        facts["message"] = f"torch {facts['torch_version']} in {venv} loads cuDNN {effective}{origin}."
