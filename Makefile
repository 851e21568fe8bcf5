# The two commands a newcomer needs (README): `make rehearse` and `make test`.
# Both install what they need first (scripts/setup-host.sh is idempotent).
SHELL := /bin/bash
VENV := .venv
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# ansible-lint and molecule ignore collections_path in ansible.cfg.
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/collections
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup rehearse bench bench-prestage test unit integration sim-down check-real

setup:
	@bash scripts/setup-host.sh

# The story on a simulated fleet (containers with fake GPUs, HAProxy in front), in four acts
# (scripts/rehearse, plans in rehearsal/): the fleet before the fix (pre-fix cuDNN, FP8);
# NVFP4 on it blocked by preflight; the same with the blocker accepted, caught by the
# canary's soak and rolled back; the fix rolled out, the canary alone then the fleet in
# batches. Clients send completions through HAProxy throughout; an act that does not show
# what it should stops the rehearsal. Ends with the HTML reports' paths.
rehearse: setup
	@python scripts/rehearse

# Rollout figures on a simulated fleet of its own (docs/BENCHMARKS.md): overhead, and the
# no-op re-run against a facts-only play. 2 cores: ~14 min beside one test session, 28 min
# beside a full test run.
bench: setup
	@python scripts/bench-rollout

# Pre-staging (parallel install against one node's) and the cuDNN-only bump's bytes, on a
# fleet of its own that installs from a counting HTTP wheelhouse. ~7 min on 2 cores (busy).
# Not part of `make bench`: the two together pass 15 minutes.
bench-prestage: setup
	@python scripts/bench-prestage

sim-down:
	@python scripts/sim-fleet down

# Everything: unit tests, module docs, ansible-lint, the simulated-node tests. Three workers
# on 2 cores, one file (or Molecule scenario) each at a time: the simulated nodes mostly
# wait (boots, soaks, readiness), and a file's tests share its nodes (tests/conftest.py
# orders the files).
PYTEST_WORKERS ?= 3
test: setup
	@mkdir -p reports/junit
	@pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadscope --durations=15 \
		--junitxml=reports/junit/pytest.xml $(PYTEST_ARGS)

unit: setup
	@pytest tests/unit $(PYTEST_ARGS)

integration: setup
	@pytest tests/integration $(PYTEST_ARGS)

# Every Molecule scenario (molecule/<role>/: one simulated node per role that can run on
# one), one after another; `make test` runs them too (tests/molecule). Each scenario's
# dependency step builds what its node needs first (scripts/molecule-fixtures). As root.
.PHONY: molecule
molecule: setup
	@molecule test --all

# Opt-in, never part of `make test`, no GPU needed (tests/real/check_real.py; as root): the
# project against the real wheels from PyPI, pip configuration shut out, in scratch venvs under
# CHECK_REAL_DIR (default a new temporary directory; a venv already holding vllm 0.25.1 there
# is reused). cudnn_facts and gpu_facts on the real nvidia-cudnn-cu13==9.24.0.43 and
# nvidia-ml-py; the real vllm==0.25.1 with its dependencies (the wheel checked against its
# sha256; ~10 GB, 5 to 12 min the first time): scripts/vllm-contract --check, its `vllm bench
# serve` run by the soak's own code (as nobody) against the stand-in server, compared key by
# key with the stand-in's bench and made to fail each way the soak must diagnose, every
# profile's rendered config through its `vllm serve` parser. ~3.5 min once the venv exists.
# CHECK_REAL_ARGS='--standin-rev HEAD' takes the stand-in as committed, not the working tree.
check-real:
	@python tests/real/check_real.py $(CHECK_REAL_ARGS) $(CHECK_REAL_DIR)

# Opt-in, not part of `make test`: ansible-test sanity (tests/sanity/run.sh) on a copy of
# the collection as galaxy.yml ships it, each test in its own venv of ansible-test's pinned
# requirements from the package index. ~35 s once the venvs are cached (~/.ansible/test),
# ~1.5 min the first time. Ignores, each with its reason: tests/sanity/ignore-2.19.txt.
# SANITY_ARGS go to ansible-test (e.g. SANITY_ARGS='--test pylint').
.PHONY: sanity
sanity: setup
	@bash tests/sanity/run.sh $(SANITY_ARGS)
