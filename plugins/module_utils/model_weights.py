# SPDX-License-Identifier: Apache-2.0
"""Model weights as a managed artifact, side by side like releases.

A model is one directory ``<models_dir>/<name>@<revision>``, staged in
``<models_dir>/.staging-<name>@<revision>`` and renamed into place only after every file
matched its sha256 and the marker ``vllm-fleet-model.json`` (each file's size and sha256,
the source, when) was written last: a directory whose marker exists is complete.

Sources:

- a site mirror, a directory on the node or an HTTP(S) URL, laid out
  ``<mirror>/<name>/<revision>/`` with a ``SHA256SUMS`` file as ``sha256sum`` writes it plus
  one ``# size <bytes>  <file>`` line per file (``stat -c '# size %s  %n'``; ``sha256sum -c``
  skips ``#`` lines): a download stops at the declared size, so a mirror cannot fill the disk,
  and the free-disk check adds the declared sizes. A profile may pin the sha256 of the
  ``SHA256SUMS`` itself (``weights.sha256sums_digest``) so the mirror cannot swap the model;
  plain ``http://`` needs ``allow_http``; a redirect to another origin is refused; a
  directory mirror's symbolic links are refused (root would follow them anywhere);
- the Hugging Face Hub (``huggingface_hub``, imported only for it) at a pinned commit:
  LFS files are checked against the Hub's sha256, the small git files against their git
  blob id. The token is read from a root-only file, never a parameter.

Plain Python (HTTP through ansible.module_utils.urls): the model_weights module calls in
here; tests/unit calls it directly.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
import shutil
import stat
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
# A file's size, as `stat -c '# size %s  %n'` writes it: a comment to `sha256sum -c`.
_SIZE_LINE = re.compile(r"^# size ([0-9]{1,15})  (.+)\Z")
_DIGEST = re.compile(r"^[0-9a-f]{64}\Z")
CHUNK = 1 << 20
MAX_SUMS_BYTES = 1 << 20  # ~10,000 files: a SHA256SUMS past it is refused, not read on
MAX_REDIRECTS = 5
ALLOW_HTTP = "vllm_fleet_model_allow_http"


WEIGHTS_KEYS = ("name", "revision", "hub_repo", "sha256sums_digest")


class WeightsError(ValueError):
    """A model that cannot be staged or is not complete, with what to do."""


@dataclass(frozen=True)
class FileSpec:
    """One file of a model: its path inside the model, its declared size (a download stops
    there) and what it must hash to (sha256, or git's blob sha1 for the Hub's non-LFS files)."""
    path: str
    size: int
    sha256: str | None = None
    git_sha1: str | None = None


# --- names and inputs ---------------------------------------------------------------------

def check_model(weights, where: str = "profile.weights") -> dict:
    """The profile's ``weights`` map checked: ``{name, revision[, hub_repo][, sha256sums_digest]}``."""
    if not isinstance(weights, dict):
        raise WeightsError(f"{where}: {weights!r} is not a mapping with name and revision (and hub_repo for the Hub)")
    errors = []
    unknown = sorted(set(map(str, weights)) - set(WEIGHTS_KEYS))
    if unknown:
        errors.append(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(WEIGHTS_KEYS)}")
    name, revision, repo = weights.get("name"), weights.get("revision"), weights.get("hub_repo")
    pinned = weights.get("sha256sums_digest")
    if pinned is not None and (not isinstance(pinned, str) or not _DIGEST.match(pinned)):
        errors.append(f"{where}.sha256sums_digest: {str(pinned)[:80]!r} is not a sha256 (64 lower-case hex):"
                      " the output of `sha256sum SHA256SUMS` for the model's revision")
    if pinned is not None and repo is not None:
        errors.append(f"{where}.sha256sums_digest pins a mirror's SHA256SUMS: with hub_repo the model comes from"
                      " the Hub, which has none; remove one of the two")
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
    return {key: weights[key] for key in WEIGHTS_KEYS if weights.get(key) is not None}


def model_dirname(name: str, revision: str) -> str:
    return f"{name}@{revision}"


def relative_path(path, where: str) -> str:
    """A file's path inside a model: relative, no '..', no empty part."""
    parts = str(path).split("/")
    if not path or str(path).startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in str(path):
        raise WeightsError(f"{where}: {path!r} is not a plain relative path inside the model")
    if path == MARKER:
        raise WeightsError(f"{where}: {MARKER} is the name of vllm-fleet's own marker (written last, it says a"
                           " model is complete): a model cannot list a file of that name")
    return str(path)


def parse_sums(text: str, where: str) -> dict[str, FileSpec]:
    """``{path: FileSpec}`` from ``sha256sum`` output (text or binary mode lines) and one
    ``# size <bytes>  <path>`` line per file; other ``#`` lines are comments. A file without
    a declared size is refused: its download could not be stopped."""
    sums: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or (line.startswith("#") and not line.startswith("# size ")):
            continue
        size = _SIZE_LINE.match(line)
        match = size or _SUMS_LINE.match(line)
        if not match:
            raise WeightsError(f"{where} line {number}: {line[:120]!r} is not a sha256sum line ('<64 hex>  <file>')"
                               " nor a size line ('# size <bytes>  <file>', at most 15 digits)")
        path = relative_path(match.group(2), f"{where} line {number}")
        listed = sizes if size else sums
        if path in listed:
            raise WeightsError(f"{where} line {number}: {path} is listed twice")
        listed[path] = int(match.group(1)) if size else match.group(1).lower()
    if not sums:
        raise WeightsError(f"{where} lists no file")
    unsized, unhashed = sorted(set(sums) - set(sizes)), sorted(set(sizes) - set(sums))
    if unsized:
        raise WeightsError(f"{where}: no declared size for {', '.join(unsized[:5])}{' ...' if len(unsized) > 5 else ''}:"
                           " a file of unknown size is not downloaded; add its '# size <bytes>  <file>' line"
                           " (stat -c '# size %s  %n' <files> >> SHA256SUMS)")
    if unhashed:
        raise WeightsError(f"{where}: a size but no sha256 for {', '.join(unhashed[:5])}")
    return {path: FileSpec(path, sizes[path], sha256=digest) for path, digest in sums.items()}


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

def _origin(url: str) -> tuple:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(
        parts.scheme.lower())


def _without_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def url_secrets(url: str) -> set[str]:
    """The credentials of a URL's user:password@, as written and decoded, for Ansible to mask."""
    parts = urllib.parse.urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    secrets = {userinfo, parts.password or ""}
    secrets |= {urllib.parse.unquote(value) for value in secrets}
    return {value for value in secrets if value}


def check_http(url: str, variable: str, allow_http: bool) -> None:
    """Plain http lets anyone on the path change the files (and the pinned-digest check is then
    all that stands) and read the credentials: only with the explicit opt-in."""
    if urllib.parse.urlsplit(url).scheme.lower() == "http" and not allow_http:
        raise WeightsError(f"{variable}: {_without_credentials(url)} is plain http: anyone on the way can read its"
                           " credentials and change the files it serves. Use https, or set"
                           f" {ALLOW_HTTP}: true to accept that")


class MirrorSource:
    """``<base>/<name>/<revision>/`` with its SHA256SUMS: a directory on the node or an
    HTTP(S) URL. ``credentials`` ("user:password", percent-encoded as in a URL) or a URL's
    own ``user:password@`` go into a Basic header, never into a message or the marker."""

    def __init__(self, base: str, name: str, revision: str, timeout: float = 60, *, credentials: str | None = None,
                 allow_http: bool = False, sums_digest: str | None = None):
        self.remote = urllib.parse.urlsplit(base).scheme in ("http", "https")
        if not self.remote and not base.startswith("/"):
            raise WeightsError(f"vllm_fleet_model_mirror: {_without_credentials(base)!r} is neither an absolute"
                               " directory on the node nor an http(s):// URL")
        self.root, self.name, self.revision = base.rstrip("/") or "/", name, revision
        self.base = base.rstrip("/") + f"/{urllib.parse.quote(name)}/{urllib.parse.quote(revision)}"
        self.timeout, self.sums_digest = timeout, sums_digest
        self.headers = {}
        if self.remote:
            check_http(base, "vllm_fleet_model_mirror", allow_http)
            parts = urllib.parse.urlsplit(self.base)
            if parts.username is not None:
                credentials = f"{parts.username}:{parts.password or ''}"
            self.base = _without_credentials(self.base)
            if credentials:
                user, _, password = credentials.partition(":")
                pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
                self.headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()

    def describe(self) -> str:
        return self.base

    def _shown(self, path: str) -> str:
        return f"{self.describe()}/{path}"

    def _open(self, path: str):
        return self._get(path) if self.remote else self._open_local(path)

    def _open_local(self, path: str):
        """The file, each part below the mirror's root opened without following a link: a
        writer of the mirror cannot make root read (and copy into a world-readable model)
        any file of the node."""
        parts = [self.name, self.revision, *path.split("/")]
        fd, where = -1, self.root
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            for index, part in enumerate(parts):
                last = index == len(parts) - 1
                where = os.path.join(self.root, *parts[:index + 1])
                try:
                    # O_NONBLOCK: a FIFO planted in the mirror must not hang the open.
                    child = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                                    | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                        raise WeightsError(f"{where} is a symbolic link: a directory mirror's links are refused"
                                           " (root would follow them anywhere on the node); put the file itself"
                                           " in the mirror") from None
                    raise
                os.close(fd)
                fd = child
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WeightsError(f"{where} is not a regular file")
            handle, fd = os.fdopen(fd, "rb"), -1
            return handle
        except OSError as exc:
            raise WeightsError(f"cannot read {self._shown(path)} from the mirror: {exc.strerror}") from None
        finally:
            if fd >= 0:
                os.close(fd)

    def _get(self, path: str):
        """GET, following a redirect only within the mirror's origin (scheme, host, port):
        urllib would send the Authorization header to any host a mirror names."""
        # Ansible's own client (proxies and CA bundles as every module honours them), imported
        # here: it pulls in ssl and cryptography (~35 ms), and the collection's filters load this
        # file in every Ansible worker that templates one of them (Jinja2Loader imports every
        # filter file of the collection to find one name), where no mirror is ever read.
        from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
        from ansible.module_utils.urls import open_url
        url = f"{self.base}/{urllib.parse.quote(path)}"
        for _ in range(MAX_REDIRECTS + 1):
            try:
                # decompress=False: the bytes hashed and counted are the bytes sent.
                return open_url(url, headers=self.headers, timeout=self.timeout, follow_redirects="none",
                                decompress=False)
            except urllib.error.HTTPError as exc:
                target = exc.filename if 300 <= exc.code < 400 and exc.filename else None
                exc.close()
                if target is None:
                    raise WeightsError(f"the mirror answered {exc.code} {exc.reason} for {self._shown(path)}") from None
                if _origin(target) != _origin(self.base):
                    raise WeightsError(f"the mirror redirected {self._shown(path)} to another origin,"
                                       f" {_without_credentials(target)}: refused, a mirror's requests (and its"
                                       " credentials) stay with the scheme, host and port vllm_fleet_model_mirror"
                                       " names; serve the files there, or name that origin as the mirror") from None
                url = _without_credentials(target)
            except (urllib.error.URLError, OSError, UrlsConnectionError) as exc:
                reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
                raise WeightsError(f"cannot read {self._shown(path)} from the mirror: {reason}") from None
        raise WeightsError(f"the mirror redirected {self._shown(path)} more than {MAX_REDIRECTS} times")

    def files(self) -> list[FileSpec]:
        with self._open(SUMS) as handle:
            raw = handle.read(MAX_SUMS_BYTES + 1)
        if len(raw) > MAX_SUMS_BYTES:
            raise WeightsError(f"{self._shown(SUMS)} is over {MAX_SUMS_BYTES} bytes: refused")
        digest = hashlib.sha256(raw).hexdigest()
        if self.sums_digest and digest != self.sums_digest:
            raise WeightsError(f"{self._shown(SUMS)} has sha256 {digest}, the profile pins {self.sums_digest}"
                               " (profile.weights.sha256sums_digest): the mirror's model is not the one the"
                               " profile was tested with; nothing was downloaded")
        specs = parse_sums(raw.decode("utf-8", "replace"), self._shown(SUMS))
        return [specs[path] for path in sorted(specs)]

    def fetch(self, spec: FileSpec, dest: str) -> None:
        with self._open(spec.path) as source, open(dest, "wb") as out:
            length = getattr(source, "headers", {}).get("Content-Length")
            if length is not None and length.strip() != str(spec.size):
                raise WeightsError(f"{spec.path} from {self.describe()}: the mirror announces {length[:40]} bytes,"
                                   f" {SUMS} declares {spec.size}: refused before the download")
            copy_capped(source, out, spec, self.describe())


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def copy_capped(source, out, spec: FileSpec, where: str) -> None:
    """Copy at most the declared size; one byte more stops the download (what is written
    is removed with the staging directory)."""
    left = spec.size
    while chunk := source.read(min(CHUNK, left + 1)):
        if len(chunk) > left:
            raise WeightsError(f"{spec.path} from {where}: more than the {spec.size} bytes {SUMS} declares:"
                               " the download was stopped there and removed")
        out.write(chunk)
        left -= len(chunk)
    if left:
        raise WeightsError(f"{spec.path} from {where}: {spec.size - left} bytes, {SUMS} declares {spec.size}")


class HubSource:
    """A Hugging Face Hub repository at a commit, through huggingface_hub."""

    def __init__(self, repo: str, revision: str, *, endpoint: str | None = None, token_file: str | None = None,
                 allow_http: bool = False):
        if endpoint:
            parts = urllib.parse.urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or "@" in parts.netloc:
                raise WeightsError(f"vllm_fleet_model_hub_endpoint: {_without_credentials(endpoint)!r} is not an"
                                   " http(s):// URL without credentials (a token goes in"
                                   " vllm_fleet_model_hub_token_file)")
            check_http(endpoint, "vllm_fleet_model_hub_endpoint", allow_http)
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
            size = sibling.lfs.size if sibling.lfs is not None else sibling.size
            if not isinstance(size, int) or size < 0:
                raise WeightsError(f"the Hub gave no size for {path} of {self.describe()}: a file of unknown size"
                                   " is not downloaded")
            if sibling.lfs is not None:
                specs.append(FileSpec(path, size, sha256=sibling.lfs.sha256))
            elif sibling.blob_id:
                specs.append(FileSpec(path, size, git_sha1=sibling.blob_id))
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
    if size != spec.size:
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
    needed = sum(spec.size for spec in specs)  # declared: a download stops there
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
