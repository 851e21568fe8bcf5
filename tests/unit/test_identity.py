"""Release code (third-party) run as an unprivileged user: module_utils/identity.as_user and
its callers, the cuDNN probes (cudnn_facts, node_state) and the soak's load generator.

The user switch itself is subprocess's (user=, group=, extra_groups=); these tests check that
every caller asks for it, and that a user who does not exist is refused before anything runs.
tests/integration/test_vllm_runtime.py shows it on a node: a .pth in a release records the uid
of every start of its Python, and the role's starts are all nobody's."""
from __future__ import annotations

import pwd

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import identity
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.cudnn import CudnnFactsError, collect_cudnn_facts
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.identity import IdentityError, as_user
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import SoakConfig
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import SoakConfigError
from tests.unit.test_cudnn_facts import LISTING, FakeRun, fake_venv  # noqa: F401 - fake_venv: a fixture

PROBE = pwd.struct_passwd(("prober", "x", 4242, 4343, "", "/nonexistent", "/usr/sbin/nologin"))


@pytest.fixture
def as_root(monkeypatch):
    """The module's view on a node: root, and a user `prober` (uid 4242, group 4343)."""
    monkeypatch.setattr(identity.os, "geteuid", lambda: 0)

    def getpwnam(name):
        if name == "prober":
            return PROBE
        raise KeyError(name)

    monkeypatch.setattr(identity.pwd, "getpwnam", getpwnam)


def test_as_user_drops_to_the_user_with_its_group_and_no_other(as_root):
    assert as_user("prober") == {"user": 4242, "group": 4343, "extra_groups": []}
    assert as_user(None) == {} and as_user("") == {}  # nobody named: the caller's own identity


def test_as_user_refuses_a_user_that_does_not_exist(as_root):
    with pytest.raises(IdentityError, match="user 'ghost' does not exist"):
        as_user("ghost")


def test_as_user_refuses_to_switch_without_root(as_root, monkeypatch):
    monkeypatch.setattr(identity.os, "geteuid", lambda: 1000)
    with pytest.raises(IdentityError, match="not root"):
        as_user("prober")
    monkeypatch.setattr(identity.os, "geteuid", lambda: 4242)
    assert as_user("prober") == {}  # already that user: nothing to switch


def test_every_cudnn_probe_runs_as_the_user(as_root, fake_venv):
    run = FakeRun((0, LISTING))
    collect_cudnn_facts(str(fake_venv), run=run, user="prober")
    assert len(run.calls) == 3
    assert all(kwargs["user"] == 4242 and kwargs["group"] == 4343 and kwargs["extra_groups"] == []
               for _, kwargs in run.calls)
    # Control: without a user the same probes run as the caller.
    run = FakeRun((0, LISTING))
    collect_cudnn_facts(str(fake_venv), run=run)
    assert not any("user" in kwargs for _, kwargs in run.calls)


def test_a_cudnn_probe_user_that_does_not_exist_fails_before_any_probe(as_root, fake_venv):
    run = FakeRun((0, LISTING))
    with pytest.raises(CudnnFactsError, match="user 'ghost' does not exist"):
        collect_cudnn_facts(str(fake_venv), run=run, user="ghost")
    assert run.calls == []


# The bench's switch to the probe user (and its scratch directory outside the release):
# tests/unit/test_soak.py::test_the_bench_runs_as_the_probe_user_with_its_own_home.


def test_a_soak_user_that_does_not_exist_is_refused_by_the_config(as_root, tmp_path):
    cfg = SoakConfig(unit="u", state_dir=str(tmp_path / "s"), duration_s=10, run_as="ghost")
    with pytest.raises(SoakConfigError, match="run_as: user 'ghost' does not exist"):
        cfg.validate()
