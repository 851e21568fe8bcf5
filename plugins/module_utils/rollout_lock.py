"""The rollout lock: a lease file (JSON) that one rollout.yml run holds at a time, as plain
Python so it can be tested without Ansible.

A lease names its holder (an id unique to the run), the controller host, the pid and user
of the ansible-playbook process, when it was taken and when it expires. It is created
atomically (written aside, then hard-linked into place: link fails if the name exists, so
of two runs taking it at once exactly one wins), renewed and released only by its holder.
A lease past its expiry, or whose process is provably gone (the lease names this very host
as controller and its pid no longer runs), is stale; it is broken only when the operator
names its holder (break_holder), never on its own.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import errno
import hashlib
import json
import os
import re
import socket
import stat

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.terminal_text import control_problem, escaped

FIELDS = ("holder", "controller", "pid", "user", "started", "expires")
TEXT_FIELDS = ("holder", "controller", "user", "started", "expires")
# A lease is about 250 bytes; the cap keeps a path pointed at a big file from being read whole.
MAX_LEASE_BYTES = 4096
MAX_FIELD_CHARS = 256
# The holder names files beside the lease (a temp file): no '/', no control character.
HOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}\Z")


class LockError(Exception):
    """Something the operator must act on; the message says what."""


class LockHeld(LockError):
    """Another run holds the lease (or held it, and it is stale but not named to break)."""

    def __init__(self, message, lease):
        super(LockHeld, self).__init__(message)
        self.lease = lease


def utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def _iso(moment):
    return moment.replace(microsecond=0).isoformat()


def _parse_time(value):
    moment = datetime.datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def pid_alive(pid):
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # another user's process, or a pid we cannot judge: assume it runs
    return True


def _where(path):
    return "%s on %s" % (escaped(path), socket.gethostname())


def _open_lease(path):
    """A read-only descriptor of the lease file, or None when there is none. A symbolic link
    is never followed (the lease is a plain file), nor a FIFO or device opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return None
        if exc.errno == errno.ELOOP and os.path.islink(path):
            target = os.readlink(path)
            dangling = "" if os.path.exists(path) else ", which does not exist"
            raise LockError("%s is a symbolic link (to %s%s): a rollout lease is a plain file and a link is never "
                            "followed. Remove the link, or set vllm_fleet_rollout_lock_path to a plain file's path. "
                            "Nothing was changed." % (_where(path), escaped(target), dangling))
        raise LockError("cannot read the rollout lease %s: %s. Set vllm_fleet_rollout_lock_path to a file the "
                        "connecting user may read and write. Nothing was changed." % (_where(path), exc.strerror))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockError("%s is not a regular file, so not a rollout lease. Set vllm_fleet_rollout_lock_path to a "
                        "file's path. Nothing was changed." % _where(path))
    return fd


def _parse_lease(data):
    """The lease data holds, or None when it is not one: JSON, an object, every field of
    the right type, both times ISO 8601."""
    try:
        lease = json.loads(data.decode("utf-8"))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return None
    if not isinstance(lease, dict) or not all(isinstance(lease.get(f), str) for f in TEXT_FIELDS) \
            or type(lease.get("pid")) is not int:
        return None
    try:
        _parse_time(lease["started"])
        _parse_time(lease["expires"])
    except ValueError:
        return None
    return lease


def read_lease(path):
    """The lease at path, or None if there is none. A file that is not a lease is an error
    (never silently replaced: it may be a lease some other version wrote), and what it holds
    is never shown: the path may name any file, a secret one too."""
    fd = _open_lease(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(MAX_LEASE_BYTES + 1)
    except (IOError, OSError) as exc:
        raise LockError("cannot read the rollout lease %s: %s. Nothing was changed." % (_where(path), exc.strerror))
    lease = _parse_lease(data) if len(data) <= MAX_LEASE_BYTES else None
    if lease is None:
        raise LockError(
            "%s is not a rollout lease (a JSON object of %s, under %d bytes); what it holds is not shown. If it is "
            "a lease some other version wrote and no rollout runs, remove it by hand and run again; otherwise set "
            "vllm_fleet_rollout_lock_path to a path of its own. Nothing was changed."
            % (_where(path), ", ".join(FIELDS), MAX_LEASE_BYTES))
    return lease


def describe(lease):
    """The lease in words; its fields as another run wrote them, escaped where not printable."""
    return ("holder %s (user %s, controller %s, pid %s), taken %s, expires %s"
            % tuple(escaped(str(lease[f])) for f in ("holder", "user", "controller", "pid", "started", "expires")))


def stale_reason(lease, now=None, hostname=None, alive=pid_alive):
    """Why the lease is stale, or None while it is live."""
    now = now or utcnow()
    if _parse_time(lease["expires"]) <= now:
        return "it expired at %s" % escaped(lease["expires"])
    if lease["controller"] == (hostname or socket.gethostname()) and not alive(lease["pid"]):
        return "its process (pid %s on %s) no longer runs" % (lease["pid"], escaped(lease["controller"]))
    return None


def _write_new(path, lease):
    """Create path with the lease, atomically: a temp file beside it, hard-linked into place."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    temp = "%s.%s.tmp" % (path, lease["holder"])
    with open(temp, "w") as handle:
        json.dump(lease, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(temp, path)
        return True
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            return False
        raise
    finally:
        os.unlink(temp)


def _replace(path, lease):
    """Rewrite our own lease in place (a renewal): written aside, then renamed over it."""
    temp = "%s.%s.tmp" % (path, lease["holder"])
    with open(temp, "w") as handle:
        json.dump(lease, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.rename(temp, path)


def _refusal(path, lease, reason, break_holder):
    where = _where(path)
    if reason is None:
        extra = ""
        if break_holder:
            extra = (" vllm_fleet_rollout_break_lock=%s does not break it: it is not stale (it is neither past its "
                     "expiry nor provably gone)." % escaped(break_holder))
        return ("Another rollout holds the rollout lock %s: %s.%s Wait until it ends; if it was killed, the lease "
                "becomes stale at %s and can then be broken. Nothing was changed."
                % (where, describe(lease), extra, escaped(lease["expires"])))
    if break_holder and break_holder != lease["holder"]:
        return ("vllm_fleet_rollout_break_lock=%s does not name the holder of the stale rollout lock %s (%s; %s). "
                "To break it: -e vllm_fleet_rollout_break_lock=%s. Nothing was changed."
                % (escaped(break_holder), where, describe(lease), reason, escaped(lease["holder"])))
    return ("The rollout lock %s is stale (%s): %s. If no rollout runs (look on %s for pid %s), break it with "
            "-e vllm_fleet_rollout_break_lock=%s and run again. Nothing was changed."
            % (where, reason, describe(lease), escaped(lease["controller"]), lease["pid"], escaped(lease["holder"])))


def field_problem(holder, controller, user, break_holder):
    """Why these cannot go into a lease (or name one to break), or None. Another run prints
    them: control characters (an escape sequence that retitles its terminal) are refused."""
    if not HOLDER.match(holder):
        return ("holder %s is not a run id: 1 to 128 letters, digits and . _ : @ + -, beginning with a letter or "
                "digit. Nothing was changed." % escaped(holder))
    for name, value in (("controller", controller), ("user", user), ("vllm_fleet_rollout_break_lock", break_holder)):
        problem = control_problem(value)
        if problem is None and len(value) > MAX_FIELD_CHARS:
            problem = "is %d characters long (at most %d)" % (len(value), MAX_FIELD_CHARS)
        if problem:
            return ("%s %s %s: a lease field is one line of printable text. Nothing was changed."
                    % (name, escaped(value[:MAX_FIELD_CHARS]), problem))
    return None


def acquire(path, holder, ttl, controller, pid, user, break_holder="", check=False, now=None, hostname=None,
            alive=pid_alive):
    """Take (or, for its own holder, renew) the lease. Returns (changed, lease, broken):
    broken is the stale lease this call broke, else None. Raises LockHeld when another run
    holds it, LockError when it cannot be read or written. In check mode nothing is written."""
    problem = field_problem(holder, controller, user, break_holder)
    if problem:
        raise LockError(problem)
    now = now or utcnow()
    lease = {"holder": holder, "controller": controller, "pid": pid, "user": user, "started": _iso(now),
             "expires": _iso(now + datetime.timedelta(seconds=ttl)), "ttl": ttl}
    broken = None
    try:
        for _attempt in range(3):  # a lease released or broken by another between read and link: look again
            current = read_lease(path)
            if current is not None and current["holder"] == holder:
                lease["started"] = current["started"]
                if not check:
                    _replace(path, lease)
                return True, lease, None
            if current is not None:
                reason = stale_reason(current, now, hostname, alive)
                if reason is None or break_holder != current["holder"]:
                    raise LockHeld(_refusal(path, current, reason, break_holder), current)
                if check:
                    return True, lease, current
                broken = _take_away(path, current)
                if broken is None:
                    continue
            if check:
                return True, lease, broken
            if _write_new(path, lease):
                return True, lease, broken
        raise LockError("the rollout lock %s changed hands while this run tried to take it: another run "
                        "is starting; run again once it ends. Nothing was changed." % _where(path))
    except (IOError, OSError) as exc:
        raise LockError("cannot take the rollout lock %s: %s. Set vllm_fleet_rollout_lock_path to a path the "
                        "connecting user may write (or run the lock host with become). Nothing was changed."
                        % (_where(path), exc.strerror or exc))


def _take_away(path, stale):
    """Move the stale lease aside, atomically (of two breakers one wins). Returns it, or None
    if another run moved it first; if what was moved is not the lease we judged, put it back."""
    # Named by a digest: the holder was written by another run and may hold '/' or '..'.
    aside = "%s.broken.%s" % (path, hashlib.sha256(stale["holder"].encode("utf-8", "surrogatepass")).hexdigest()[:16])
    try:
        os.rename(path, aside)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    moved = read_lease(aside)
    if moved is None or moved["holder"] != stale["holder"]:
        try:
            os.link(aside, path)
        finally:
            os.unlink(aside)
        raise LockError("the rollout lock %s changed hands while this run broke it: another run is starting; "
                        "nothing was changed." % _where(path))
    os.unlink(aside)
    return moved


def release(path, holder, check=False):
    """Remove the lease if, and only if, this holder holds it. Returns (changed, lease): lease
    is what was released, None if there was no lease. Raises LockHeld when another holds it."""
    current = read_lease(path)
    if current is None:
        return False, None
    if current["holder"] != holder:
        raise LockHeld("The rollout lock %s is held by %s, not by this run (%s): it was left alone. This "
                       "run's lease was broken while it ran; check that both runs left the fleet as it should be."
                       % (_where(path), describe(current), escaped(holder)), current)
    if not check:
        try:
            os.unlink(path)
        except (IOError, OSError) as exc:
            if exc.errno != errno.ENOENT:
                raise LockError("cannot remove the rollout lock %s: %s" % (_where(path), exc.strerror))
    return True, current


def lock_task(params, check=False):
    """The rollout_lock task, wherever it runs (the module on the lock host, or the action
    plugin in the controller's own process): params as the module's argument spec gives them.
    Returns the task's result: changed, lease and broken, or failed and msg."""
    if not params["holder"].strip():
        return {"failed": True, "msg": "holder is empty: give the id of this run"}
    if params["ttl"] < 1:
        return {"failed": True, "msg": "ttl %d is not a number of seconds >= 1" % params["ttl"]}
    try:
        if params["state"] == "present":
            changed, lease, broken = acquire(
                params["path"], params["holder"], params["ttl"], params["controller"], params["pid"],
                params["user"], break_holder=params["break_holder"], check=check)
        else:
            changed, lease = release(params["path"], params["holder"], check=check)
            broken = None
    except LockError as exc:
        return {"failed": True, "msg": str(exc), "lease": getattr(exc, "lease", None) or {}, "broken": {}}
    return {"changed": changed, "lease": lease or {}, "broken": broken or {}}
