"""The rollout role: packs prompts, generates one completion per row (a prompt's
rl.rollout.samples_per_prompt rows come from the data role), and refuses to sample with
weights of the wrong policy_version (S-FLOW-6, S-FLOW-7)."""

from __future__ import annotations

import time
from typing import Any

import torch

from configs.code_folders import use_run_code_dirs
from configs.schema import PPOConfig
from data.packing import MULTIMODAL_EXTRA, concat_multimodal
from data.packer_choice import build_packer
from models.model_io import ensure_model, load_tokenizer
from placement.role_placement import RolePlacement
from roles.rollout.engine import RolloutEngine
from contracts.generated_rows import AbortedGeneration, GeneratedRowError, check_generated
from contracts.trajectory import PromptBatch, Trajectory
from environments.factory import episode_rows, episode_runner, episode_seeds
from trainer.runtime import configure_torch_threads
from weights.publication import WeightPublication
from weights.receive import receive


class StalePolicyError(RuntimeError):
    pass


# The env/* figures an evaluation reports as val/*.
VAL_EPISODE = ("env/turns_mean", "env/tool_calls_mean", "env/cut_fraction", "env/errors")


def build_engine(config: PPOConfig, placement: RolePlacement, model_path: str, tokenizer) -> RolloutEngine:
    engine = config.rl.rollout.engine
    if engine == "hf":
        from roles.rollout.hf_engine import HFEngine

        return HFEngine(
            model_path, config.model.dtype, tokenizer.eos_token_id, tokenizer.pad_token_id,
            device=placement.on_visible_device().device,
        )
    if engine == "vllm":
        from roles.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path, config.model.dtype, tokenizer.eos_token_id, tokenizer.pad_token_id,
            gpu_memory_utilization=config.rl.rollout.gpu_memory_utilization,
            tensor_parallel_size=config.grid.rollout_tensor_parallel_size,
            enable_sleep_mode=placement.parks,  # S-RUN-4
            seed=config.job.seed,
        )
    raise NotImplementedError(f"rl.rollout.engine={engine!r}: accepted engines are hf and vllm")


def merge_shards(parts: list[Trajectory], pad_token_id: int) -> Trajectory:
    """One batch from the shards the rollout engines generated, in shard order, laid
    out as one engine would have: prompts left-padded to the longest prompt of the
    batch, responses right-padded to the longest response."""
    if len(parts) == 1:
        return parts[0]
    versions = {part.policy_version for part in parts}
    if len(versions) != 1:
        raise RuntimeError(
            f"rollout engines sampled iteration {parts[0].iteration} with different policy_versions {sorted(versions)}"
        )
    p = max(part.prompt_length for part in parts)
    r = max(part.response_ids.shape[1] for part in parts)

    def left(tensor: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (p - tensor.shape[1], 0), value=value)

    def right(tensor: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (0, r - tensor.shape[1]), value=value)

    extras = {}
    if MULTIMODAL_EXTRA in parts[0].extras:
        extras[MULTIMODAL_EXTRA] = concat_multimodal([part.extras[MULTIMODAL_EXTRA] for part in parts], p)
    return Trajectory(
        iteration=parts[0].iteration,
        policy_version=parts[0].policy_version,
        prompts=PromptBatch.concat([part.prompts for part in parts]),
        prompt_ids=torch.cat([left(part.prompt_ids, pad_token_id) for part in parts]),
        prompt_mask=torch.cat([left(part.prompt_mask, 0) for part in parts]),
        response_ids=torch.cat([right(part.response_ids, pad_token_id) for part in parts]),
        response_mask=torch.cat([right(part.response_mask, 0.0) for part in parts]),
        rollout_logprobs=torch.cat([right(part.rollout_logprobs, 0.0) for part in parts]),
        completions=[c for part in parts for c in part.completions],
        action_mask=torch.cat([right(part.action_mask, 0.0) for part in parts]),
        token_scores=torch.cat([right(part.token_scores, 0.0) for part in parts]),
        correct=None if parts[0].correct is None else torch.cat([part.correct for part in parts]),
        extras=extras,
        transcripts=tuple(transcript for part in parts for transcript in part.transcripts),
    )


SUMMED_EPISODE = ("env/errors", "env/tool_call_parse_errors")
SLOWEST_EPISODE = ("env/episode_seconds", "env/step_wait_seconds")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)  # equal shards: the mean of the shards' means is the batch's


class RolloutRole:
    """One rollout engine. With several engines (one per GPU, or per
    `grid.rollout_tensor_parallel_size` GPUs; `grid.cpu_rollout_engines` on the host),
    engine `i` generates shard `i` of each batch and engine 0 gathers the shards."""

    def __init__(self, config: PPOConfig, placement: RolePlacement):
        use_run_code_dirs()  # S-BYO-3: a packer or environment beside the profile
        configure_torch_threads(config.rl.threads_per_role)
        self.config = config
        self.rank = placement.rank
        model_path = ensure_model(config.model)
        self.tokenizer = load_tokenizer(model_path)
        # S-RUN-6: the packer alone turns prompts into model inputs; a configured
        # factory replaces the default chosen from the model's config.json.
        self.packer = build_packer(
            model_path, config.data_packer.factory, config.data_packer.factory_kwargs, config.job.trusted_modules
        )
        self.engine = build_engine(config, placement, model_path, self.tokenizer)
        # S-ENV: with an environment, each prompt row is the start of a multi-turn episode;
        # without one, of a one-turn episode. Chosen once, here (S-PATH-1).
        self.episodes = episode_runner(config, self.tokenizer, model_path) if config.rl.env is not None else None
        self._sample_batch = self._one_turn if self.episodes is None else self._episodes
        # S-RUN-4: sharing its GPUs with the trainer, the engine sleeps between rollouts.
        self.sleep_between_rollouts = placement.parks
        self.policy_version = 0  # the weights from_pretrained loaded are version 0
        self.weight_loads = 0  # counted so tests and users can see warmup moves no weights (S-CW-5)
        self.built_at = time.time()  # wall clock: how long a replacement engine took to start (S-ELASTIC-2)

    def ready(self) -> dict[str, Any]:
        device = "managed by the engine" if self.engine.device is None else str(self.engine.device)
        return {
            "role": "rollout", "policy_version": self.policy_version, "device": device, "rank": self.rank,
            "built_at": self.built_at,
        }

    def generate(
        self, prompts: PromptBatch, required_version: int, shard: int = 0, shards: int = 1
    ) -> tuple[Trajectory, dict[str, float]]:
        """One completion per row of shard `shard` of `shards` of the batch; the rows of
        one prompt are different draws of its stream (S-OPT-2)."""
        first_position = 0
        if shards > 1:
            first_position = shard * (len(prompts.prompts) // shards)
            prompts = prompts.shard(shard, shards)
        # Per iteration and shard: a resumed run samples what the uninterrupted one
        # did, and no two engines draw the same stream.
        seed = self.config.job.seed * 1_000_003 + prompts.iteration + 7_919 * shard
        try:
            trajectory, seconds, episode_metrics = self._sample(
                prompts, required_version, seed, greedy=False, first=first_position
            )
        except AbortedGeneration as aborted:
            raise GeneratedRowError(
                f"iteration {prompts.iteration}: the engine aborted row {prompts.row_ids[aborted.position]} "
                f"(shard {shard} of {shards}, position {aborted.position}); a failed generation is never trained on"
            ) from aborted
        check_generated(trajectory, prompts.row_ids)  # S-ELASTIC-3
        lengths = trajectory.response_mask.sum(dim=1)
        return trajectory, {
            "rollout/response_length_mean": float(lengths.mean()),
            "rollout/generate_seconds": seconds,
            "rollout/policy_version": float(self.policy_version),
            "perf/rollout_weight_loads": float(self.weight_loads),
            **episode_metrics,
        }

    def evaluate(self, prompts: PromptBatch, required_version: int) -> tuple[Trajectory, dict[str, float]]:
        """Held-out evaluation with the weights this engine holds (S-OPS-2): greedy, or
        sampled from a seed stream of its own so no training rollout's draw changes."""
        validation = self.config.rl.validation
        if validation is None:
            raise RuntimeError("evaluation asked for, but rl.validation is not configured")
        seed = (self.config.job.seed * 1_000_003 + prompts.iteration) * 31 + 1_000_000_007
        trajectory, seconds, episode_metrics = self._sample(
            prompts, required_version, seed, greedy=validation.greedy, stream=1
        )
        return trajectory, {
            **{f"val/{key.partition('/')[2]}": value for key, value in episode_metrics.items() if key in VAL_EPISODE},
            "val/response_length_mean": float(trajectory.response_mask.sum(dim=1).mean()),
            "val/generate_seconds": seconds,
            "val/policy_version": float(self.policy_version),
            "val/prompts": float(len(trajectory.completions)),
        }

    def _sample(
        self, prompts: PromptBatch, required_version: int, seed: int, greedy: bool, first: int = 0, stream: int = 0
    ) -> tuple[Trajectory, float, dict[str, float]]:
        """The trajectory, its seconds, and a multi-turn batch's env/* figures."""
        if required_version != self.policy_version:
            # Equality, not "at least": a newer engine is as wrong as an older one.
            raise StalePolicyError(
                f"rollout holds policy_version {self.policy_version} but iteration {prompts.iteration} "
                f"requires {required_version}"
            )
        started = time.perf_counter()
        self.engine.wake_up()
        trajectory, metrics = self._sample_batch(prompts, seed, greedy, first, stream)
        if self.sleep_between_rollouts:
            self.engine.sleep()
        return trajectory, time.perf_counter() - started, metrics

    def _one_turn(
        self, prompts: PromptBatch, seed: int, greedy: bool, first: int, stream: int
    ) -> tuple[Trajectory, dict[str, float]]:
        """One completion per prompt (S-FLOW-7): a one-turn episode."""
        packed = self.packer.pack_prompts(prompts.prompts, prompts.sources)
        if packed.multimodal is not None and not self.engine.accepts_multimodal:
            raise NotImplementedError(
                f"rl.rollout.engine={self.config.rl.rollout.engine!r} does not take the multimodal inputs of "
                f"{type(self.packer).__name__} yet; use rl.rollout.engine=hf for vision-language models"
            )
        rollout = self.config.rl.rollout
        result = self.engine.generate(
            packed, max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature, seed=seed, greedy=greedy
        )
        completions = self.packer.decode_completions(result.response_ids, result.response_mask)
        trajectory = Trajectory.one_turn(
            iteration=prompts.iteration, policy_version=self.policy_version, prompts=prompts,
            prompt_ids=packed.input_ids, prompt_mask=packed.attention_mask, response_ids=result.response_ids,
            response_mask=result.response_mask, rollout_logprobs=result.logprobs, completions=completions,
            # The packed pixels travel with the batch by reference, so reference,
            # critic and policy see exactly what the rollout showed the model.
            extras={MULTIMODAL_EXTRA: packed.multimodal} if packed.multimodal is not None else {},
        )
        return trajectory, {}

    def _episodes(
        self, prompts: PromptBatch, seed: int, greedy: bool, first: int, stream: int
    ) -> tuple[Trajectory, dict[str, float]]:
        """Multi-turn episodes (S-ENV-2): the environment's messages are context, the
        sampled turns are actions, and each turn's reward sits on its last token. An
        episode is correct when it earned more than nothing (docs/howto/environments.md)."""
        assert self.episodes is not None
        seeds = episode_seeds(
            self.config.job.seed, prompts.iteration, prompts.row_ids, first, stream, prompts.group_ids
        )
        batch = self.episodes.run(
            self.engine, episode_rows(prompts), seeds,
            temperature=self.config.rl.rollout.temperature, generation_seed=seed, greedy=greedy,
        )
        trajectory = Trajectory(
            iteration=prompts.iteration, policy_version=self.policy_version, prompts=prompts,
            prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask, response_ids=batch.response_ids,
            response_mask=batch.response_mask, rollout_logprobs=batch.logprobs, completions=batch.completions,
            action_mask=batch.action_mask, token_scores=batch.turn_rewards,
            correct=(batch.turn_rewards.sum(dim=1) > 0).float(), transcripts=tuple(batch.transcripts),
        )
        return trajectory, batch.metrics

    def gather(self, shards: int, *parts_and_summaries) -> tuple[Trajectory, dict[str, float]]:
        """Engine 0, after its own shard: the whole batch from every engine's shard
        (`shards` trajectories, then their `shards` summaries). The summary is the
        batch's: lengths averaged over all rows, the slowest engine's time."""
        parts, summaries = list(parts_and_summaries[:shards]), list(parts_and_summaries[shards:])
        trajectory = merge_shards(parts, self.tokenizer.pad_token_id)
        lengths = trajectory.response_mask.sum(dim=1)
        episode = {
            key: (sum if key in SUMMED_EPISODE else max if key in SLOWEST_EPISODE else _mean)(
                [summary[key] for summary in summaries]
            )
            for key in summaries[0] if key.startswith("env/")
        }
        return trajectory, {
            **summaries[0],
            **episode,
            "rollout/response_length_mean": float(lengths.mean()),
            "rollout/generate_seconds": max(s["rollout/generate_seconds"] for s in summaries),
            "rollout/engines": float(shards),
        }

    def load_weights(self, published: WeightPublication, policy_version: int) -> dict[str, float]:
        """The policy's buckets, fetched and copied in one after the other (S-SCALE-3).
        A publication that misses a weight or carries one twice is refused before any
        is copied, and the engine keeps its version."""
        started = time.perf_counter()
        # Over NIXL a stalled read fails this engine by name before the stage's own timeout.
        timeout = self.config.rl.stage_timeout_seconds
        buckets = receive(
            published, policy_version, f"rollout engine {self.rank}", self.engine.weight_names(),
            timeout_s=None if timeout is None else 0.8 * timeout, loopback=self.config.grid.num_nodes == 1,
            owned=self.engine.keeps_buckets,
        )
        received = self.engine.load_weights(buckets)
        self.policy_version = policy_version
        self.weight_loads += 1
        metrics = {
            "perf/weight_sync_bytes": float(received),
            "perf/weight_sync_buckets": float(published.buckets),
            "perf/weight_sync_load_seconds": time.perf_counter() - started,
        }
        if published.transport == "nixl":
            metrics["perf/weight_sync_nixl_bytes"] = float(sum(bucket.nbytes for bucket in published.stored))
        return metrics
