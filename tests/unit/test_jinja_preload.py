"""The jinja_preload callback (plugins/callback/jinja_preload.py), which ansible.cfg enables: the
controller loads the Jinja plugins before it forks, so no worker loads them again, and plays
run as they do without it (the same play, with and without, the same results in the same order)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTS = [f"n{i}" for i in range(1, 6)]
FILTER_PACKAGE = "ansible_collections.vllm_fleet.fleet.plugins.filter."

# What the rollout leans on: serial batches, run_once, a conditional skip, a loop, a host that
# fails with any_errors_fatal, meta end_host, filters and tests of both kinds.
PLAYS = [
    {"hosts": "all", "gather_facts": False, "serial": [1, "50%", "100%"], "tasks": [
        {"name": "Batch", "ansible.builtin.debug": {"msg": "{{ ansible_play_batch | to_json }}"}, "run_once": True},
        {"name": "Filters", "ansible.builtin.debug": {
            "msg": "{{ {'vllm': '0.25.1', 'torch': '2.11.0', 'cudnn_package': 'nvidia-cudnn-cu13', "
                   "'cudnn': '9.24.0.43'} | vllm_fleet.fleet.release_id }} {{ inventory_hostname is match('n[12]') }}"}},
        {"name": "Skip odd", "ansible.builtin.debug": {"msg": "even"},
         "when": "inventory_hostname[-1] | int is divisibleby 2"},
        {"name": "Loop", "ansible.builtin.debug": {"msg": "{{ item }}"}, "loop": [1, 2]},
        {"name": "End n3", "ansible.builtin.meta": "end_host", "when": "inventory_hostname == 'n3'"},
        {"name": "After", "ansible.builtin.debug": {"msg": "after"}},
    ]},
    {"hosts": "all", "gather_facts": False, "any_errors_fatal": True, "tasks": [
        {"name": "Fail n2", "ansible.builtin.fail": {"msg": "n2 fails"}, "when": "inventory_hostname == 'n2'"},
        {"name": "Never", "ansible.builtin.debug": {"msg": "never"}},
    ]},
]

# ansible-playbook, with each forked worker writing down the modules it imported itself.
WATCHED_PLAYBOOK = """
import json, os, sys
from ansible.executor.process import worker
run = worker.WorkerProcess._run
def watched(self):
    before = set(sys.modules)
    try:
        return run(self)
    finally:
        with open(os.path.join(os.environ["IMPORTS_DIR"], f"{os.getpid()}.json"), "w") as out:
            json.dump({"task": self._task.get_name(), "imported": sorted(set(sys.modules) - before)}, out)
worker.WorkerProcess._run = watched
sys.argv = ["ansible-playbook"] + sys.argv[1:]
from ansible.cli.playbook import main
main()
"""


def run(tmp_path: Path, **env: str) -> tuple[int, list, list]:
    """The plays on local hosts: (rc, what each task did on each host, what each worker imported)."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {h: {"ansible_connection": "local"} for h in HOSTS}}}))
    playbook = tmp_path / "play.json"
    playbook.write_text(json.dumps(PLAYS))
    imports = tmp_path / "imports"
    imports.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", WATCHED_PLAYBOOK, "-i", str(inventory), str(playbook)],
        # Ansible stops the workers still alive when a play or a batch ends, by default at once:
        # a worker of its last task could be stopped before it writes down its imports.
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
             "ANSIBLE_WORKER_SHUTDOWN_POLL_COUNT": "100", "IMPORTS_DIR": str(imports), **env},
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    out = json.loads(proc.stdout)
    # (task, host, what it said or whether it failed or skipped): tasks in the order they ran, the
    # hosts of one task by name (their results come back in whatever order the workers end).
    events = [(task["task"]["name"], host, result.get("msg"), result.get("failed", False),
               result.get("skipped", False), [item.get("msg") for item in result.get("results", [])])
              for play in out["plays"] for task in play["tasks"] for host, result in sorted(task["hosts"].items())]
    workers = [json.loads(path.read_text()) for path in imports.iterdir()]
    return proc.returncode, events, workers


def filter_imports(workers: list) -> list:
    return [w["task"] for w in workers if any(m.startswith(FILTER_PACKAGE) for m in w["imported"])]


def test_plays_run_the_same_and_no_worker_loads_the_filters_again(tmp_path):
    preloaded, plain = tmp_path / "preloaded", tmp_path / "plain"
    preloaded.mkdir()
    plain.mkdir()
    rc, events, workers = run(preloaded)  # ansible.cfg's callbacks: jinja_preload
    # Only the stdout callback (Ansible refuses an empty name), in place of ansible.cfg's list.
    plain_rc, plain_events, plain_workers = run(plain, ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.json")
    assert (rc, events) == (plain_rc, plain_events)
    # The play really exercised what it claims (a comparison of two empty runs proves nothing).
    assert rc != 0 and ("Fail n2", "n2", "n2 fails", True, False, []) in events
    assert not any(name == "Never" for name, *_ in events)
    assert [msg for name, _, msg, *_ in events if name == "Batch"] == ['["n1"]', '["n2", "n3"]', '["n4", "n5"]']
    assert ("After", "n3", "after", False, False, []) not in events
    assert any(name == "Filters" and msg.startswith("vllm-0.25.1_") and msg.endswith("True") for name, _, msg, *_ in events)
    # Without it, every worker that templates this collection's filter imports the filter files
    # (the negative control: the watch sees imports when they happen); with it, none does.
    assert sorted(filter_imports(plain_workers)) == ["Filters"] * len(HOSTS)
    assert filter_imports(workers) == []
    # ... and the watch saw those workers run (not merely no imports), and as many in all.
    assert [w["task"] for w in workers if w["task"] == "Filters"] == ["Filters"] * len(HOSTS)
    assert len(workers) == len(plain_workers)


def test_what_it_loads_ahead_exists_and_loads_every_filter_of_the_collection():
    # Each name must resolve, or the preload silently loads nothing (it never stops a run).
    probe = """
import json, sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1]])
from ansible_collections.vllm_fleet.fleet.plugins.callback.jinja_preload import PRELOAD
for loader, name in PRELOAD:
    assert loader.get(name) is not None, name
print(json.dumps(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith(sys.argv[2]))))
"""
    out = subprocess.run([sys.executable, "-c", probe, str(ROOT / "collections"), FILTER_PACKAGE],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert json.loads(out) == sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.py") if p.stem != "__init__")
