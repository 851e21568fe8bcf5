"""Suite-wide scheduling for `make test`'s workers (pytest-xdist, --dist loadscope): a
file's tests run on one worker and share its fleet; the Molecule scenarios are one class
each (tests/molecule/test_molecule.py), so each is a unit of its own. The longest files
are handed out first, so the workers finish at about the same time instead of one
starting the fault matrix after the others have run out of work."""
from __future__ import annotations

# Longest first, from a run's JUnit times (CI in a fresh clone, 2026-12-06 16:28: test_faults
# 839 s of one worker, test_faults_late 374 s before its lost-node test (~150 s) came, the
# Molecule scenarios 595 s together but each a unit of its own of ~120 s, so they fill the end);
# every other file takes under 75 s.
LONGEST_FIRST = ("tests/integration/test_faults.py", "tests/integration/test_faults_late.py",
                 "tests/integration/test_rollout.py", "tests/integration/test_faults_install.py",
                 "tests/integration/test_bad_input.py", "tests/integration/test_rotation.py",
                 "tests/integration/test_rollout_lock.py", "tests/integration/test_notify.py",
                 "tests/integration/test_vllm_service.py", "tests/integration/test_lb_reload.py",
                 "tests/molecule/test_molecule.py", "tests/integration/test_vllm_runtime.py",
                 "tests/integration/test_soak.py", "tests/integration/test_preflight.py",
                 "tests/integration/test_coredump.py", "tests/integration/test_model_weights.py",
                 "tests/integration/test_monitoring.py",
                 "tests/integration/test_collection_install.py")


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items):
    items.sort(key=_rank)  # stable: file order within a rank, test order within a file
