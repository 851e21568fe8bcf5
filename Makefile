# The two commands a newcomer needs (README): `make rehearse` and `make test`.
# Both install what they need first (scripts/setup-host.sh is idempotent).
SHELL := /bin/bash
VENV := .venv
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# ansible-lint and molecule ignore collections_path in ansible.cfg.
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/collections
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup rehearse test unit integration lint sim-down

setup:
	@bash scripts/setup-host.sh

# A simulated fleet on this machine (containers with fake GPUs), then preflight on it.
rehearse: setup
	@python scripts/sim-fleet up
	@ansible-playbook -i .sim/inventory.yml playbooks/preflight.yml

sim-down:
	@python scripts/sim-fleet down

# Everything: unit tests, module docs, ansible-lint, the simulated-node tests.
test: setup
	@mkdir -p reports/junit
	@pytest -p no:cacheprovider --junitxml=reports/junit/pytest.xml $(PYTEST_ARGS)

unit: setup
	@pytest tests/unit $(PYTEST_ARGS)

integration: setup
	@pytest tests/integration $(PYTEST_ARGS)
