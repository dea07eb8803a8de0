# Two commands on a fresh machine: `make run` (the CPU profile, end to end) and
# `make test`. Both bootstrap .venv through `make setup`, which is idempotent.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: setup run test test-slow lock clean-runs

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	@touch $(STAMP)
	@echo "setup: $(VENV) ready"

# The CPU profile end to end: embedded Prefect API, a local Ray, a tiny local model.
# Extra overrides: make run ARGS="rl.max_steps=5 job.name=try1"
run: setup
	$(VPY) -m flows.ppo --config configs/ppo_tiny_cpu.py -- $(ARGS)

test: setup
	$(VPY) -m pytest -q

test-slow: setup
	$(VPY) -m pytest -q -m slow

# Re-resolve the pinned versions from pyproject.toml in a scratch environment.
lock:
	rm -rf /tmp/ppo-lock-venv && $(PYTHON) -m venv /tmp/ppo-lock-venv
	/tmp/ppo-lock-venv/bin/pip install --quiet "torch==2.13.0" $$($(PYTHON) -c "import tomllib;print(' '.join(repr(d) for d in tomllib.load(open('pyproject.toml','rb'))['project']['dependencies'] if not d.startswith('torch')))" | tr -d "'")
	(echo "# Exact versions for the default (CPU) install, resolved on Python 3.11 from pyproject.toml."; echo "# torch 2.13.0 is the CPU build on these machines and the version vLLM 0.32 pins."; echo "# Regenerate: make lock"; /tmp/ppo-lock-venv/bin/pip freeze | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/') > requirements.lock
