"""The rollout lock's logic (plugins/module_utils/rollout_lock.py), as plain Python: take,
refuse naming the holder, renew, release only one's own lease, stale leases refused unless
named, corrupt lease files, check mode writing nothing."""
from __future__ import annotations

import datetime
import json
import socket

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.rollout_lock import LockError, LockHeld, acquire, read_lease, release

NOW = datetime.datetime(2026, 12, 4, 14, 0, tzinfo=datetime.timezone.utc)


def take(path, holder, now=NOW, **kw):
    kw.setdefault("alive", lambda pid: True)
    return acquire(str(path), holder, 3600, kw.pop("controller", "ctl01"), kw.pop("pid", 4242), "deploy", now=now,
                   **kw)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "lock" / "rollout.lock"  # the directory is created on the first take


def test_take_writes_the_lease_with_holder_controller_pid_user_start_and_expiry(path):
    changed, lease, broken = take(path, "run-a")
    assert changed and broken is None
    on_disk = json.loads(path.read_text())
    assert on_disk == lease
    assert (on_disk["holder"], on_disk["controller"], on_disk["pid"], on_disk["user"]) == ("run-a", "ctl01", 4242,
                                                                                          "deploy")
    assert (on_disk["started"], on_disk["expires"]) == ("2026-12-04T14:00:00+00:00", "2026-12-04T15:00:00+00:00")
    assert sorted(p.name for p in path.parent.iterdir()) == ["rollout.lock"]  # no temp file left


def test_a_second_run_is_refused_naming_the_holder(path):
    take(path, "run-a")
    with pytest.raises(LockHeld) as refused:
        take(path, "run-b", now=NOW + datetime.timedelta(minutes=5))
    message = str(refused.value)
    for word in ("run-a", "controller ctl01", "pid 4242", "user deploy", "2026-12-04T14:00:00+00:00",
                 "expires 2026-12-04T15:00:00+00:00", str(path), "Nothing was changed"):
        assert word in message, (word, message)
    assert read_lease(str(path))["holder"] == "run-a"  # untouched


def test_the_holder_renews_its_own_lease_keeping_its_start(path):
    take(path, "run-a")
    changed, lease, _ = take(path, "run-a", now=NOW + datetime.timedelta(minutes=30))
    assert changed
    assert (lease["started"], lease["expires"]) == ("2026-12-04T14:00:00+00:00", "2026-12-04T15:30:00+00:00")
    assert read_lease(str(path)) == lease


def test_release_removes_only_its_own_lease(path):
    take(path, "run-a")
    with pytest.raises(LockHeld) as refused:
        release(str(path), "run-b")
    assert "held by holder run-a" in str(refused.value) and "left alone" in str(refused.value)
    assert path.exists()

    changed, lease = release(str(path), "run-a")
    assert changed and lease["holder"] == "run-a" and not path.exists()
    assert release(str(path), "run-a") == (False, None)  # released already: nothing to do


def test_a_stale_lease_is_refused_without_the_break_variable_and_says_what_to_type(path):
    take(path, "run-a")
    later = NOW + datetime.timedelta(hours=2)
    with pytest.raises(LockHeld) as refused:
        take(path, "run-b", now=later)
    message = str(refused.value)
    assert "is stale (it expired at 2026-12-04T15:00:00+00:00)" in message
    assert "-e vllm_fleet_rollout_break_lock=run-a" in message
    assert read_lease(str(path))["holder"] == "run-a"

    # Naming another holder breaks nothing either.
    with pytest.raises(LockHeld) as wrong:
        take(path, "run-b", now=later, break_holder="run-x")
    assert "does not name the holder" in str(wrong.value) and "break_lock=run-a" in str(wrong.value)

    changed, lease, broken = take(path, "run-b", now=later, break_holder="run-a")
    assert changed and broken["holder"] == "run-a" and lease["holder"] == "run-b"
    assert read_lease(str(path))["holder"] == "run-b"
    assert sorted(p.name for p in path.parent.iterdir()) == ["rollout.lock"]


def test_a_live_lease_is_never_broken_even_when_named(path):
    take(path, "run-a")
    with pytest.raises(LockHeld) as refused:
        take(path, "run-b", now=NOW + datetime.timedelta(minutes=1), break_holder="run-a")
    assert "does not break it: it is not stale" in str(refused.value)
    assert read_lease(str(path))["holder"] == "run-a"


def test_a_lease_whose_process_is_gone_from_this_controller_is_stale_before_its_expiry(path):
    here = socket.gethostname()
    take(path, "run-a", controller=here, pid=999999)
    soon = NOW + datetime.timedelta(minutes=1)
    with pytest.raises(LockHeld) as refused:
        take(path, "run-b", now=soon, controller=here, alive=lambda pid: False)
    assert f"its process (pid 999999 on {here}) no longer runs" in str(refused.value)
    # The same lease, its process still running: live.
    with pytest.raises(LockHeld) as live:
        take(path, "run-b", now=soon, controller=here, alive=lambda pid: True, break_holder="run-a")
    assert "not stale" in str(live.value)
    assert take(path, "run-b", now=soon, alive=lambda pid: False, break_holder="run-a")[2]["holder"] == "run-a"


def test_check_mode_judges_but_writes_nothing(path):
    changed, lease, _ = take(path, "run-a", check=True)
    assert changed and lease["holder"] == "run-a" and not path.exists()
    take(path, "run-a")
    with pytest.raises(LockHeld):
        take(path, "run-b", check=True)  # a dry run is refused like a real one
    assert release(str(path), "run-a", check=True)[0] and path.exists()


SECRET = "sk-live-5f3c9a0e1b7d42c8a6e4"


# The last three: vllm_fleet_rollout_lock_path pointed at the API key file printed the key.
@pytest.mark.parametrize("text", ["", "not json", "[]", '{"holder": "run-a"}',
                                  '{"holder": "a", "controller": "c", "pid": 1, "user": "u", "started": "soon",'
                                  ' "expires": "later"}',
                                  f"{SECRET}\n", f'{{"api_key": "{SECRET}"}}\n',
                                  f'{{"holder": "{SECRET}", "pid": "1"}}\n'],
                         ids=["empty", "not-json", "list", "missing-fields", "bad-times", "key-file", "json-secret",
                              "lease-shaped-secret"])
def test_a_file_that_is_not_a_lease_is_a_clear_error_never_shown_and_left_alone(path, text):
    path.parent.mkdir()
    path.write_text(text)
    for attempt in (lambda: take(path, "run-b"), lambda: release(str(path), "run-b")):
        with pytest.raises(LockError) as error:
            attempt()
        message = str(error.value)
        assert f"{path} on {socket.gethostname()} is not a rollout lease" in message
        assert "what it holds is not shown" in message and "remove it by hand" in message
        assert SECRET not in message and (not text.strip() or text.strip() not in message), message
    assert path.read_text() == text


def test_an_unwritable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LockError) as error:
        take(blocker / "rollout.lock", "run-a")
    assert f"the rollout lease {blocker / 'rollout.lock'}" in str(error.value)
    assert "Set vllm_fleet_rollout_lock_path" in str(error.value)


def test_of_two_runs_taking_at_once_one_wins(path, monkeypatch):
    # Run b reads no lease, then run a links its lease first: b's link fails, b reads again
    # and is refused naming a.
    import ansible_collections.vllm_fleet.fleet.plugins.module_utils.rollout_lock as mod

    real_read = mod.read_lease
    calls = []

    def read_then_race(p):
        calls.append(p)
        if len(calls) == 1:
            take(path, "run-a")
            return None
        return real_read(p)

    monkeypatch.setattr(mod, "read_lease", read_then_race)
    with pytest.raises(LockHeld) as refused:
        take(path, "run-b")
    assert "holder run-a" in str(refused.value)
    assert real_read(str(path))["holder"] == "run-a"


# --- issue 32: hostile lease paths and fields -------------------------------------------------

def test_a_big_file_is_not_a_lease_and_is_not_read_whole(path, monkeypatch):
    path.parent.mkdir()
    path.write_bytes(b"{" + b" " * (1 << 20) + b"}")
    import ansible_collections.vllm_fleet.fleet.plugins.module_utils.rollout_lock as mod
    with pytest.raises(LockError) as error:
        take(path, "run-b")
    assert f"under {mod.MAX_LEASE_BYTES} bytes" in str(error.value)


def test_a_dangling_symlink_lease_is_refused_as_a_link(path, tmp_path):
    # Reproduction: the link made every take fail with "changed hands ... another run is starting".
    path.parent.mkdir()
    path.symlink_to(tmp_path / "nowhere")
    with pytest.raises(LockError) as error:
        take(path, "run-b")
    message = str(error.value)
    assert f"{path} on {socket.gethostname()} is a symbolic link (to {tmp_path / 'nowhere'}, which does not exist)" \
        in message, message
    assert "changed hands" not in message and "Nothing was changed" in message
    assert path.is_symlink() and not (tmp_path / "nowhere").exists()


def test_a_symlink_to_a_real_lease_is_not_followed(path, tmp_path):
    real = tmp_path / "real.lock"
    take(real, "run-a")
    before = real.read_text()
    path.parent.mkdir()
    path.symlink_to(real)
    for attempt in (lambda: take(path, "run-a"), lambda: release(str(path), "run-a")):
        with pytest.raises(LockError) as error:
            attempt()
        assert "is a symbolic link (to " in str(error.value) and "which does not exist" not in str(error.value)
    assert real.read_text() == before


def test_a_directory_is_not_a_lease(path):
    path.mkdir(parents=True)
    with pytest.raises(LockError) as error:
        take(path, "run-b")
    assert "is not a regular file, so not a rollout lease" in str(error.value)


OSC = "\x1b]0;rollout finished\x07"  # retitles the operator's terminal
CSI = "\x1b[2J"  # clears it


@pytest.mark.parametrize("field", ["holder", "controller", "user", "break_holder"])
@pytest.mark.parametrize("sequence", [OSC, CSI, "\n", "\x9b2J"], ids=["osc", "csi", "newline", "c1-csi"])
def test_a_lease_field_with_an_escape_sequence_is_refused_when_taking(path, field, sequence):
    args = {"holder": "run-a", "controller": "ctl01", "user": "deploy", "break_holder": ""}
    args[field] = f"x{sequence}y"
    with pytest.raises(LockError) as error:
        acquire(str(path), args["holder"], 3600, args["controller"], 1, args["user"],
                break_holder=args["break_holder"], now=NOW)
    message = str(error.value)
    name = "vllm_fleet_rollout_break_lock" if field == "break_holder" else field
    assert message.startswith(f"{name} x"), message
    assert not any(c in message for c in "\x1b\x07\n\x9b"), message
    assert "Nothing was changed" in message
    assert not path.exists()


def test_a_holder_that_is_a_path_is_refused(path, tmp_path):
    with pytest.raises(LockError) as error:
        take(path, "../../outside")
    assert "holder ../../outside is not a run id" in str(error.value)
    assert not path.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def write_foreign_lease(path, **fields):
    lease = {"holder": "run-a", "controller": "ctl01", "pid": 4242, "user": "deploy",
             "started": "2026-12-04T14:00:00+00:00", "expires": "2026-12-04T15:00:00+00:00", **fields}
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(lease))


@pytest.mark.parametrize("field", ["holder", "controller", "user"])
def test_a_lease_another_wrote_with_escape_sequences_is_shown_escaped(path, field):
    write_foreign_lease(path, **{field: f"evil{OSC}{CSI}"})
    with pytest.raises(LockHeld) as refused:
        take(path, "run-b", now=NOW + datetime.timedelta(minutes=5))
    message = str(refused.value)
    assert "evil\\x1b]0;rollout finished\\x07\\x1b[2J" in message, message
    assert "\x1b" not in message and "\x07" not in message


def test_a_plain_lease_is_shown_as_it_is(path):  # negative control of the escaping
    write_foreign_lease(path, user="deploy")
    with pytest.raises(LockHeld) as refused:
        take(path, "run-b", now=NOW + datetime.timedelta(minutes=5))
    assert "holder run-a (user deploy, controller ctl01, pid 4242)" in str(refused.value)


def test_breaking_a_stale_lease_whose_holder_is_a_path_stays_beside_the_lease(path, tmp_path):
    write_foreign_lease(path, holder="../../../broken-out")
    later = NOW + datetime.timedelta(hours=2)
    changed, lease, broken = take(path, "run-b", now=later, break_holder="../../../broken-out")
    assert changed and broken["holder"] == "../../../broken-out"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["lock", "lock/rollout.lock"]
