"""Fixtures that boot simulated nodes (rootful podman, systemd as PID 1)."""
from __future__ import annotations

import itertools
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fixtures.simnode import simnode

HERE = Path(__file__).resolve().parent
# The pid in the prefix keeps concurrent sessions on one host apart.
PREFIX = f"vf-test-{os.getpid()}-"
_batch = itertools.count()


@pytest.hookimpl(tryfirst=True)  # before -m selects on it
def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def node_image() -> str:
    """The simulated-node image, built on first use (about a minute)."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: run scripts/setup-host.sh as root", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("integration tests need rootful podman: run them as root", pytrace=False)
    simnode.remove_nodes("vf-test-", stale_only=True)
    return simnode.ensure_image()


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory) -> Path:
    from tests.fixtures.nvml.build import build_fake_nvml

    return build_fake_nvml(tmp_path_factory.mktemp("nvml"))


def profile_path(profile: str | Path) -> Path:
    from tests.fixtures.nvml.build import PROFILES_DIR

    path = Path(profile) if Path(profile).suffix else PROFILES_DIR / f"{profile}.conf"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.conf"))
        raise FileNotFoundError(f"no fake NVML profile {profile!r}; known: {known}")
    return path


@pytest.fixture
def sim_nodes(node_image, request):
    """Factory: sim_nodes({"gpu1": "rtx_pro_6000", "cpu1": None}) -> [Node, Node];
    sim_nodes(spec, volumes=("/host/wheels:/srv/wheelhouse:ro",)) mounts into every node.

    A profile is a name in the fake NVML profiles dir or a path to a .conf file; None
    gives a node without any NVIDIA driver. Nodes boot in parallel and are removed when
    the test ends, pass or fail.
    """
    prefixes = []

    def start(spec: dict[str, str | Path | None], volumes: tuple[str, ...] = ()) -> list[simnode.Node]:
        prefix = f"{PREFIX}{next(_batch)}-"
        prefixes.append(prefix)
        lib = request.getfixturevalue("fake_nvml_lib") if any(p is not None for p in spec.values()) else None

        def boot(item):
            name, profile = item
            if profile is None:
                return simnode.start_node(name, image=node_image, prefix=prefix, volumes=volumes)
            return simnode.start_node(name, nvml_lib=lib, nvml_profile=profile_path(profile),
                                      image=node_image, prefix=prefix, volumes=volumes)

        with ThreadPoolExecutor(max_workers=max(1, len(spec))) as pool:
            return list(pool.map(boot, spec.items()))

    yield start
    for prefix in prefixes:
        simnode.remove_nodes(prefix)
