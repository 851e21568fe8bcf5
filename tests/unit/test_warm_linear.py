"""The warm_linear strategy (plugins/strategy/warm_linear.py): the controller loads the Jinja
plugins before it forks, and plays run exactly as under Ansible's own linear strategy (checked
against it: the same play, both strategies, the same results in the same order)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTS = [f"n{i}" for i in range(1, 6)]

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


def run(tmp_path: Path, strategy: str) -> tuple[int, list]:
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {h: {"ansible_connection": "local"} for h in HOSTS}}}))
    playbook = tmp_path / "play.json"
    playbook.write_text(json.dumps(PLAYS))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_STRATEGY": strategy}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                           str(playbook)], env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
    out = json.loads(proc.stdout)
    # (task, host, what it said or whether it failed or skipped): tasks in the order they ran, the
    # hosts of one task by name (their results come back in whatever order the workers end).
    events = [(task["task"]["name"], host, result.get("msg"), result.get("failed", False),
               result.get("skipped", False), [item.get("msg") for item in result.get("results", [])])
              for play in out["plays"] for task in play["tasks"] for host, result in sorted(task["hosts"].items())]
    return proc.returncode, events


def test_plays_run_as_under_ansibles_linear_strategy(tmp_path):
    linear, warm = tmp_path / "linear", tmp_path / "warm"
    linear.mkdir()
    warm.mkdir()
    warm_run = run(warm, "vllm_fleet.fleet.warm_linear")
    assert warm_run == run(linear, "ansible.builtin.linear")
    rc, events = warm_run
    # The play really exercised what it claims (a comparison of two empty runs proves nothing).
    assert rc != 0 and ("Fail n2", "n2", "n2 fails", True, False, []) in events
    assert not any(name == "Never" for name, *_ in events)
    assert [msg for name, _, msg, *_ in events if name == "Batch"] == ['["n1"]', '["n2", "n3"]', '["n4", "n5"]']
    assert ("After", "n3", "after", False, False, []) not in events
    assert any(name == "Filters" and msg.startswith("vllm-0.25.1_") and msg.endswith("True") for name, _, msg, *_ in events)


def test_what_it_loads_ahead_exists_and_loads_every_filter_of_the_collection():
    # Each name must resolve, or the warm-up silently loads nothing (it never stops a run).
    probe = """
import sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1]])
from ansible_collections.vllm_fleet.fleet.plugins.strategy.warm_linear import WARM
for loader, name in WARM:
    assert loader.get(name) is not None, name
print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('ansible_collections.vllm_fleet.fleet.plugins.filter.')))
"""
    out = subprocess.run([sys.executable, "-c", probe, str(ROOT / "collections")], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    loaded = json.loads(out.replace("'", '"'))
    assert loaded == sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.py") if p.stem != "__init__")
