# SPDX-License-Identifier: Apache-2.0
"""Model weights as a managed artifact, side by side like releases.

A model is one directory ``<models_dir>/<name>@<revision>``, staged in
``<models_dir>/.staging-<name>@<revision>`` and renamed into place only after every file
matched its sha256 and the marker ``vllm-fleet-model.json`` (each file's size and sha256,
the source, when) was written last: a directory whose marker exists is complete.

Sources:

- a site mirror, a directory on the node or an HTTP(S) URL, laid out
  ``<mirror>/<name>/<revision>/`` with a ``SHA256SUMS`` file as ``sha256sum`` writes it;
- the Hugging Face Hub (``huggingface_hub``, imported only for it) at a pinned commit:
  LFS files are checked against the Hub's sha256, the small git files against their git
  blob id. The token is read from a root-only file, never a parameter.

Plain Python (HTTP through ansible.module_utils.urls): the model_weights module calls in
here; tests/unit calls it directly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass

# Staged like releases: the same .staging-/.pruning- names and the same removal.
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.releases import (
    PRUNING_PREFIX, STAGING_PREFIX, delete_side_by_side)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.secret_file import SecretFileError, read_secret_file

MARKER = "vllm-fleet-model.json"
MARKER_SCHEMA_VERSION = 1
SUMS = "SHA256SUMS"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}\Z")
_COMMIT = re.compile(r"^[0-9a-f]{40}\Z")
# `sha256sum` output: the hash, a space, then a space (text) or * (binary), then the name.
_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)\Z")
CHUNK = 1 << 20


class WeightsError(ValueError):
    """A model that cannot be staged or is not complete, with what to do."""


@dataclass(frozen=True)
class FileSpec:
    """One file of a model: its path inside the model, its size (None: not known before
    the download) and what it must hash to (sha256, or git's blob sha1 for the Hub's
    non-LFS files)."""
    path: str
    size: int | None
    sha256: str | None = None
    git_sha1: str | None = None


# --- names and inputs ---------------------------------------------------------------------

def check_model(weights, where: str = "profile.weights") -> dict:
    """The profile's ``weights`` map checked: ``{name, revision[, hub_repo]}``."""
    if not isinstance(weights, dict):
        raise WeightsError(f"{where}: {weights!r} is not a mapping with name and revision (and hub_repo for the Hub)")
    errors = []
    unknown = sorted(set(map(str, weights)) - {"name", "revision", "hub_repo"})
    if unknown:
        errors.append(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: name, revision, hub_repo")
    name, revision, repo = weights.get("name"), weights.get("revision"), weights.get("hub_repo")
    if not isinstance(name, str) or not _NAME.match(name):
        errors.append(f"{where}.name: {name!r} is not a directory name (letters, digits, . _ -, at most 128)")
    if repo is not None:
        if not isinstance(repo, str) or not _HUB_REPO.match(repo):
            errors.append(f"{where}.hub_repo: {repo!r} is not a Hub repository id (owner/name)")
        if not isinstance(revision, str) or not _COMMIT.match(revision):
            errors.append(f"{where}.revision: {revision!r} is not a commit: the Hub source needs the 40-hex commit id"
                          " the model was tested at (a branch or tag moves)")
    elif not isinstance(revision, str) or not _NAME.match(revision):
        errors.append(f"{where}.revision{' is required' if revision is None else f': {revision!r} is not allowed'}:"
                      " the mirror's revision directory (letters, digits, . _ -), pinned so a model never"
                      " changes under a node")
    if errors:
        raise WeightsError("; ".join(errors))
    return {key: weights[key] for key in ("name", "revision", "hub_repo") if weights.get(key) is not None}


def model_dirname(name: str, revision: str) -> str:
    return f"{name}@{revision}"


def relative_path(path, where: str) -> str:
    """A file's path inside a model: relative, no '..', no empty part."""
    parts = str(path).split("/")
    if not path or str(path).startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in str(path):
        raise WeightsError(f"{where}: {path!r} is not a plain relative path inside the model")
    return str(path)


def parse_sums(text: str, where: str) -> dict[str, str]:
    """``{path: sha256}`` from ``sha256sum`` output (text or binary mode lines)."""
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _SUMS_LINE.match(line)
        if not match:
            raise WeightsError(f"{where} line {number}: {line[:120]!r} is not a sha256sum line ('<64 hex>  <file>')")
        path = relative_path(match.group(2), f"{where} line {number}")
        if path in sums:
            raise WeightsError(f"{where} line {number}: {path} is listed twice")
        sums[path] = match.group(1).lower()
    if not sums:
        raise WeightsError(f"{where} lists no file")
    return sums


def read_token(path: str) -> str:
    """The Hub token from a file only root can read (mode 0600 or 0400, owner root)."""
    try:
        token = read_secret_file(path, "vllm_fleet_model_hub_token_file", owner_uid=0, owner="root")
    except SecretFileError as exc:
        raise WeightsError(str(exc)) from None
    if any(ch.isspace() for ch in token):
        raise WeightsError(f"vllm_fleet_model_hub_token_file: {path} must hold one token (no spaces or lines)")
    return token


# --- sources ------------------------------------------------------------------------------

class MirrorSource:
    """``<base>/<name>/<revision>/`` with its SHA256SUMS: a directory on the node or an
    HTTP(S) URL."""

    def __init__(self, base: str, name: str, revision: str, timeout: float = 60):
        self.remote = urllib.parse.urlsplit(base).scheme in ("http", "https")
        if not self.remote and not base.startswith("/"):
            raise WeightsError(f"vllm_fleet_model_mirror: {base!r} is neither an absolute directory on the node"
                               " nor an http(s):// URL")
        self.base = base.rstrip("/") + f"/{urllib.parse.quote(name)}/{urllib.parse.quote(revision)}"
        self.timeout = timeout
        self.headers = {}
        parts = urllib.parse.urlsplit(self.base)
        if self.remote and parts.username is not None:
            # urllib takes no credentials in a URL: they go in a header, and out of every message.
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
            self.base = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()

    def describe(self) -> str:
        return self.base

    def _where(self, path: str) -> str:
        return f"{self.base}/{urllib.parse.quote(path)}" if self.remote else os.path.join(self.base, path)

    def _open(self, path: str, method: str = "GET"):
        # Ansible's own client (proxies and CA bundles as every module honours them), imported
        # here: it pulls in ssl and cryptography (~35 ms), and the collection's filters load this
        # file in every Ansible worker that templates one of them (Jinja2Loader imports every
        # filter file of the collection to find one name), where no mirror is ever read.
        from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
        from ansible.module_utils.urls import open_url
        where = self._where(path)
        try:
            if self.remote:
                return open_url(where, method=method, headers=self.headers, timeout=self.timeout)
            return open(where, "rb")
        except urllib.error.HTTPError as exc:
            raise WeightsError(f"the mirror answered {exc.code} {exc.reason} for {self._shown(path)}") from None
        except (urllib.error.URLError, OSError, UrlsConnectionError) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
            raise WeightsError(f"cannot read {self._shown(path)} from the mirror: {reason}") from None

    def _shown(self, path: str) -> str:
        return f"{self.describe()}/{path}"

    def files(self) -> list[FileSpec]:
        with self._open(SUMS) as handle:
            sums = parse_sums(handle.read().decode("utf-8", "replace"), self._shown(SUMS))
        return [FileSpec(path, self._size(path), sha256=digest) for path, digest in sorted(sums.items())]

    def _size(self, path: str) -> int | None:
        if not self.remote:
            try:
                return os.stat(self._where(path)).st_size
            except OSError as exc:
                raise WeightsError(f"{self._shown(path)} is listed in {SUMS} but cannot be read: {exc.strerror}") from None
        with self._open(path, "HEAD") as answer:
            length = answer.headers.get("Content-Length")
        return int(length) if length and length.isdigit() else None

    def fetch(self, spec: FileSpec, dest: str) -> None:
        with self._open(spec.path) as source, open(dest, "wb") as out:
            shutil.copyfileobj(source, out, CHUNK)


class HubSource:
    """A Hugging Face Hub repository at a commit, through huggingface_hub."""

    def __init__(self, repo: str, revision: str, *, endpoint: str | None = None, token_file: str | None = None):
        try:
            import huggingface_hub  # noqa: F401  (only the Hub source needs it)
        except ImportError:
            raise WeightsError("the Hub source (profile.weights.hub_repo) needs huggingface_hub in the node's Python"
                               " (ansible_python_interpreter): install it there, or serve the model from a site"
                               " mirror (vllm_fleet_model_mirror)") from None
        self.repo, self.revision, self.endpoint = repo, revision, endpoint or None
        self.token = read_token(token_file) if token_file else False  # False: never a cached login

    def describe(self) -> str:
        return f"{self.endpoint or 'https://huggingface.co'}/{self.repo}@{self.revision}"

    def files(self) -> list[FileSpec]:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        try:
            info = HfApi(endpoint=self.endpoint, token=self.token).model_info(
                self.repo, revision=self.revision, files_metadata=True)
        except HfHubHTTPError as exc:
            raise WeightsError(f"the Hub refused {self.describe()}: {str(exc).splitlines()[0]}") from None
        except Exception as exc:  # noqa: BLE001 (httpx's and requests' network errors are no OSError)
            raise WeightsError(f"cannot reach the Hub for {self.describe()}: {type(exc).__name__}: {exc}") from None
        specs = []
        for sibling in info.siblings or []:
            path = relative_path(sibling.rfilename, f"{self.describe()}")
            if sibling.lfs is not None:
                specs.append(FileSpec(path, sibling.lfs.size, sha256=sibling.lfs.sha256))
            elif sibling.blob_id:
                specs.append(FileSpec(path, sibling.size, git_sha1=sibling.blob_id))
            else:
                raise WeightsError(f"the Hub gave no hash for {path} of {self.describe()}: it cannot be verified")
        if not specs:
            raise WeightsError(f"{self.describe()} has no files")
        return specs

    def fetch(self, spec: FileSpec, dest: str) -> None:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError

        folder = os.path.dirname(dest) + "/.hub-" + os.path.basename(dest)
        try:
            got = hf_hub_download(self.repo, spec.path, revision=self.revision, endpoint=self.endpoint,
                                  token=self.token, local_dir=folder)
        except HfHubHTTPError as exc:
            raise WeightsError(f"the Hub refused {spec.path} of {self.describe()}: {str(exc).splitlines()[0]}") from None
        except Exception as exc:  # noqa: BLE001 (as in files())
            raise WeightsError(f"cannot download {spec.path} of {self.describe()}: {type(exc).__name__}: {exc}") from None
        os.replace(got, dest)
        shutil.rmtree(folder, ignore_errors=True)


# --- staging, checking, pruning -----------------------------------------------------------

def _digests(path: str) -> tuple[int, str, str]:
    """(size, sha256, git blob sha1) of a file, read once."""
    size = os.path.getsize(path)
    sha256, git = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())  # noqa: S324 (git's own id)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            sha256.update(chunk)
            git.update(chunk)
    return size, sha256.hexdigest(), git.hexdigest()


def _verify(spec: FileSpec, path: str, where: str) -> dict:
    size, sha256, git_sha1 = _digests(path)
    if spec.size is not None and size != spec.size:
        raise WeightsError(f"{spec.path} from {where}: {size} bytes, the source says {spec.size}")
    if spec.sha256 and sha256 != spec.sha256:
        raise WeightsError(f"{spec.path} from {where}: sha256 {sha256}, the manifest says {spec.sha256}:"
                           " the file is corrupt or the mirror changed")
    if spec.git_sha1 and git_sha1 != spec.git_sha1:
        raise WeightsError(f"{spec.path} from {where}: git blob {git_sha1}, the Hub says {spec.git_sha1}")
    return {"size": size, "sha256": sha256}


def free_bytes(directory: str) -> int:
    """Free bytes on the filesystem that holds directory (or its nearest existing parent)."""
    while not os.path.exists(directory):
        directory = os.path.dirname(directory)
    return shutil.disk_usage(directory).free


def read_marker(path: str) -> dict | None:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as handle:
            marker = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{path}/{MARKER} cannot be read ({exc}): remove {path} and stage it again") from None
    if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
        raise WeightsError(f"{path}/{MARKER} is not a model marker: remove {path} and stage it again")
    return marker


def check(models_dir: str, name: str, revision: str, *, rehash: bool = False) -> dict:
    """Whether the model is present and complete: marker there, every file it lists there
    with its size (and, with rehash, its sha256). Read-only."""
    path = os.path.join(models_dir, model_dirname(name, revision))
    result = {"path": path, "present": False, "verified": False, "files": 0, "bytes": 0, "source": None,
              "problems": []}
    marker = read_marker(path)
    if marker is None:
        result["problems"].append(f"{path} is not staged (no {MARKER})")
        return result
    result["present"], result["source"] = True, marker.get("source")
    for rel, expected in sorted(marker["files"].items()):
        file_path = os.path.join(path, relative_path(rel, f"{path}/{MARKER}"))
        try:
            size = os.path.getsize(file_path)
        except OSError:
            result["problems"].append(f"{rel} is missing")
            continue
        if size != expected.get("size"):
            result["problems"].append(f"{rel} is {size} bytes, staged as {expected.get('size')}")
        elif rehash and _digests(file_path)[1] != expected.get("sha256"):
            result["problems"].append(f"{rel} no longer has the sha256 it was staged with")
        result["files"] += 1
        result["bytes"] += size
    result["verified"] = not result["problems"]
    return result


def stage(models_dir: str, name: str, revision: str, source, *, reserve_bytes: int = 0,
          check_mode: bool = False, now=time.time) -> dict:
    """Stage the model unless it is complete already. Returns ``{changed, path, files,
    bytes, source}``; raises WeightsError, leaving no staging directory, when the source
    cannot be read, the disk is too small or a file does not match its hash."""
    final = os.path.join(models_dir, model_dirname(name, revision))
    present = check(models_dir, name, revision)
    if present["verified"]:
        return {"changed": False, "path": final, "files": present["files"], "bytes": present["bytes"],
                "source": present["source"]}
    if present["present"]:
        raise WeightsError(f"{final} is staged but no longer complete ({'; '.join(present['problems'])}):"
                           f" remove {final} (not served now) and run again to stage it afresh")
    specs = source.files()
    needed = sum(spec.size or 0 for spec in specs)
    free = free_bytes(models_dir)
    if needed + reserve_bytes > free:
        raise WeightsError(f"{models_dir} has {free / 2**30:.1f} GiB free: {name}@{revision} needs"
                           f" {needed / 2**30:.1f} GiB plus the {reserve_bytes / 2**30:.1f} GiB kept free"
                           " (vllm_fleet_model_reserve_gib); prune old models or make room")
    if check_mode:
        return {"changed": True, "path": final, "files": len(specs), "bytes": needed, "source": source.describe()}
    staging = os.path.join(models_dir, STAGING_PREFIX + model_dirname(name, revision))
    shutil.rmtree(staging, ignore_errors=True)
    try:
        files = {}
        for spec in specs:
            dest = os.path.join(staging, spec.path)
            os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
            source.fetch(spec, dest + ".part")
            files[spec.path] = _verify(spec, dest + ".part", source.describe())
            os.replace(dest + ".part", dest)
        marker = {"schema": MARKER_SCHEMA_VERSION, "name": name, "revision": revision,
                  "source": source.describe(), "staged_at": now(), "files": files}
        with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as handle:
            json.dump(marker, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(staging, 0o755)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"changed": True, "path": final, "files": len(files), "bytes": sum(f["size"] for f in files.values()),
            "source": marker["source"]}


def prune(models_dir: str, protect: list[str], config_dirs: list[str], *, check_mode: bool = False) -> dict:
    """Remove staged models no one needs: keep every path in protect and every model a
    configuration in config_dirs names (the serving one and the known-good one). Leftover
    staging and pruning directories go too. Other entries are left alone."""
    if not os.path.isdir(models_dir):
        return {"changed": False, "kept": [], "removed": [], "ignored": []}
    named = ""
    for directory in config_dirs:
        for entry in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if entry.endswith(".yaml"):
                with open(os.path.join(directory, entry), encoding="utf-8", errors="replace") as handle:
                    named += handle.read() + "\n"
    kept, removed, ignored = [], [], []
    for entry in sorted(os.listdir(models_dir)):
        path = os.path.join(models_dir, entry)
        if entry.startswith((STAGING_PREFIX, PRUNING_PREFIX)) and os.path.isdir(path):
            removed.append(entry)
        elif os.path.islink(path) or not os.path.isdir(path) or "@" not in entry:
            ignored.append(entry)
        elif path in protect or re.search(re.escape(path) + r"(?![^\s\"'])", named):
            kept.append(entry)
        else:
            removed.append(entry)
    if not check_mode:
        for entry in removed:
            delete_side_by_side(models_dir, entry)
    return {"changed": bool(removed), "kept": kept, "removed": removed, "ignored": ignored}
