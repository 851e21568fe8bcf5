"""What the benchmark scripts share (scripts/bench-rollout, scripts/bench-prestage): this
checkout on sys.path, a simulated fleet of a bench's own that always comes down, and
timed playbook runs. Figures, not assertions: a failed play stops the bench, a slow one
is only a number."""
from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(ROOT / "collections"))

from ansible import constants as C  # noqa: E402  (reads the ANSIBLE_CONFIG set above)
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
    return measured(sim, playbook, *args, **plan).wall


@dataclass
class Measured:
    wall: float  # seconds
    cpu: float  # controller CPU-seconds: ansible-playbook and every process it waited for
    module_runs: dict  # scripts/callback_plugins/module_runs.py: {"node": {host: n}, ...}


def measured(sim: SimFleet, playbook: str, *args: str, **plan) -> Measured:
    """One run of ``playbook`` with its wall time, the controller's CPU time and the module
    runs Ansible made on each node (counted by a callback); a failed run ends the bench."""
    with tempfile.NamedTemporaryFile(suffix=".json") as counts:
        # The counter beside the callbacks ansible.cfg enables (jinja_preload): the variable
        # replaces the setting, and the bench measures what an operator's run does.
        env = {"ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "scripts" / "callback_plugins"),
               "ANSIBLE_CALLBACKS_ENABLED": ",".join([*C.CALLBACKS_ENABLED, "module_runs"]),
               "VLLM_FLEET_MODULE_RUNS": counts.name}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            cpu_before = _children_cpu()
            start = time.monotonic()
            run = story.play(sim, playbook, *args, **plan)
            wall = time.monotonic() - start
            cpu = _children_cpu() - cpu_before
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        if run.rc != 0:
            sys.exit(f"{_bench()}: {playbook} {' '.join(args)} failed (rc {run.rc}):\n{run.output[-3000:]}")
        runs = json.loads(Path(counts.name).read_text() or "{}")
    return Measured(wall, cpu, runs)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spread(values: list[float]) -> dict:
    """Median and range of a figure over runs."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "runs": [round(v, 2) for v in values]}


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
