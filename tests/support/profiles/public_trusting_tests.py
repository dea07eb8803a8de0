"""configs/ppo_qwen06b_public_4gpu.py with tests/ trusted: overrides may name `tests.…` callables."""

from configs.ppo_qwen06b_public_4gpu import CONFIG as BASE

CONFIG = BASE.model_copy(update={"job": BASE.job.model_copy(update={"trusted_modules": ["tests"]})})
