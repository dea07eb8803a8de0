"""The rollout role: packs prompts, generates one completion each, and refuses to
sample with weights of the wrong policy_version (S-FLOW-6, S-FLOW-7)."""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch

from configs.schema import PPOConfig
from data.packing import MULTIMODAL_EXTRA, build_packer
from roles.model_io import ensure_model, load_tokenizer
from roles.placement import plan_placement, role_device
from roles.rollout.engine import RolloutEngine
from roles.runtime import configure_torch_threads
from roles.trajectory import PromptBatch, Trajectory


class StalePolicyError(RuntimeError):
    pass


def build_engine(config: PPOConfig, model_path: str, tokenizer) -> RolloutEngine:
    engine = config.rl.rollout.engine
    if engine == "hf":
        from roles.rollout.hf_engine import HFEngine

        return HFEngine(
            model_path, config.model.dtype, tokenizer.eos_token_id, tokenizer.pad_token_id,
            device=role_device(config, "rollout"),
        )
    if engine == "vllm":
        from roles.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path, config.model.dtype, tokenizer.eos_token_id, tokenizer.pad_token_id,
            gpu_memory_utilization=config.rl.rollout.gpu_memory_utilization,
            tensor_parallel_size=config.grid.rollout_tensor_parallel_size,
            enable_sleep_mode=plan_placement(config).offload_active,  # S-RUN-4
            seed=config.job.seed,
        )
    raise NotImplementedError(f"rl.rollout.engine={engine!r}: accepted engines are hf and vllm")


class RolloutRole:
    def __init__(self, config: PPOConfig):
        configure_torch_threads(config.rl.threads_per_role)
        self.config = config
        model_path = ensure_model(config.model)
        self.tokenizer = load_tokenizer(model_path)
        # S-RUN-6: the packer alone turns prompts into model inputs; a configured
        # factory replaces the default chosen from the model's config.json.
        self.packer = build_packer(model_path, config.data_packer.factory, config.data_packer.factory_kwargs)
        self.engine = build_engine(config, model_path, self.tokenizer)
        # S-RUN-4: sharing its GPUs with the trainer, the engine sleeps between rollouts.
        self.sleep_between_rollouts = plan_placement(config).offload_active
        self.policy_version = 0  # the weights from_pretrained loaded are version 0
        self.weight_loads = 0  # counted so tests and users can see warmup moves no weights (S-CW-5)

    def ready(self) -> dict[str, Any]:
        # vLLM places itself (its own workers inside the actor's GPU bundle).
        device = str(getattr(self.engine, "device", "managed by the engine"))
        return {"role": "rollout", "policy_version": self.policy_version, "device": device}

    def generate(self, prompts: PromptBatch, required_version: int) -> tuple[Trajectory, dict[str, float]]:
        if required_version != self.policy_version:
            # Equality, not "at least": a newer engine is as wrong as an older one.
            raise StalePolicyError(
                f"rollout holds policy_version {self.policy_version} but iteration {prompts.iteration} "
                f"requires {required_version}"
            )
        started = time.perf_counter()
        packed = self.packer.pack_prompts(prompts.prompts, prompts.sources)
        if packed.multimodal is not None and not getattr(self.engine, "accepts_multimodal", False):
            raise NotImplementedError(
                f"rl.rollout.engine={self.config.rl.rollout.engine!r} does not take the multimodal inputs of "
                f"{type(self.packer).__name__} yet; use rl.rollout.engine=hf for vision-language models"
            )
        rollout = self.config.rl.rollout
        self.engine.wake_up()
        result = self.engine.generate(
            packed,
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            seed=self.config.job.seed * 1_000_003 + prompts.iteration,
        )
        if self.sleep_between_rollouts:
            self.engine.sleep()
        completions = self.packer.decode_completions(result.response_ids, result.response_mask)
        trajectory = Trajectory(
            iteration=prompts.iteration,
            policy_version=self.policy_version,
            prompts=prompts,
            prompt_ids=packed.input_ids,
            prompt_mask=packed.attention_mask,
            response_ids=result.response_ids,
            response_mask=result.response_mask,
            rollout_logprobs=result.logprobs,
            completions=completions,
            # The packed pixels travel with the batch by reference, so reference,
            # critic and policy see exactly what the rollout showed the model.
            extras={MULTIMODAL_EXTRA: packed.multimodal} if packed.multimodal is not None else {},
        )
        lengths = result.response_mask.sum(dim=1)
        return trajectory, {
            "rollout/response_length_mean": float(lengths.mean()),
            "rollout/generate_seconds": time.perf_counter() - started,
            "rollout/policy_version": float(self.policy_version),
            "perf/rollout_weight_loads": float(self.weight_loads),
        }

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], policy_version: int) -> dict[str, float]:
        started = time.perf_counter()
        received = self.engine.load_weights(named_tensors)
        self.policy_version = policy_version
        self.weight_loads += 1
        return {
            "perf/weight_sync_bytes": float(received),
            "perf/weight_sync_load_seconds": time.perf_counter() - started,
        }
