"""Suite-wide ordering for `make test`'s workers (pytest-xdist, --dist loadfile): the
longest files are handed out first, so two workers finish at about the same time instead
of one starting the rollout story after the other has run out of work."""
from __future__ import annotations

# Minutes on 2 cores, longest first (the CI log's --durations); every other file is short.
LONGEST_FIRST = ("tests/integration/test_rollout.py", "tests/molecule/test_molecule.py",
                 "tests/integration/test_vllm_service.py", "tests/integration/test_soak.py")


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items):
    items.sort(key=_rank)  # stable: file order within a rank, test order within a file
