"""configs/ppo_tiny_vlm_cpu.py with the project's tests/ trusted: their overrides may name `tests.…` callables."""

from configs.ppo_tiny_vlm_cpu import CONFIG as BASE

CONFIG = BASE.model_copy(update={"job": BASE.job.model_copy(update={"trusted_modules": ["tests"]})})
