"""What the benchmark scripts share (scripts/bench-rollout, scripts/bench-prestage): this
checkout on sys.path, a simulated fleet of a bench's own that always comes down, and
timed playbook runs. Figures, not assertions: a failed play stops the bench, a slow one
is only a number."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(ROOT / "collections"))

from tests.fixtures import story  # noqa: E402  (the story's plan and stand-in knobs)
from tests.fixtures.simnode.fleet import SimFleet  # noqa: E402
from tests.fixtures.wheels.build import build_node_wheelhouse  # noqa: E402

NODE_WHEELHOUSE = "/srv/wheelhouse"


def load() -> float:
    """The 1-minute load average: what else the machine was doing (record it with the figures)."""
    return round(os.getloadavg()[0], 1)


def _bench() -> str:
    return Path(sys.argv[0]).name


def timed(sim: SimFleet, playbook: str, *args: str, **plan) -> float:
    """Wall time of one run of ``playbook`` (story.play: the release, profile and accepted
    risks in ``plan``); a failed run ends the bench with its output."""
    start = time.monotonic()
    run = story.play(sim, playbook, *args, **plan)
    wall = time.monotonic() - start
    if run.rc != 0:
        sys.exit(f"{_bench()}: {playbook} {' '.join(args)} failed (rc {run.rc}):\n{run.output[-3000:]}")
    return wall


@contextlib.contextmanager
def bench_fleet(name: str, nodes: int, base_port: int, lb_port: int, group_vars: dict,
                mount_wheelhouse: bool = True):
    """A fleet of ``nodes`` with its own directory, container prefix and ports, removed on the
    way out whatever happens. Yields (fleet, wheelhouse): the node wheelhouse built on the
    host, mounted read-only at NODE_WHEELHOUSE on every node when ``mount_wheelhouse``."""
    workdir = Path(tempfile.mkdtemp(prefix=f"vf-{name}-"))
    sim = SimFleet(workdir / "fleet", prefix=f"vf-{name}-{os.getpid()}-", base_port=base_port, lb_port=lb_port)
    try:
        wheelhouse = build_node_wheelhouse(workdir / "wheelhouse")
        volumes = (f"{wheelhouse}:{NODE_WHEELHOUSE}:ro",) if mount_wheelhouse else ()
        sim.up(nodes, volumes=volumes, group_vars=group_vars)
        yield sim, wheelhouse
    finally:
        sim.down()
