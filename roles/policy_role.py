"""The policy role: freezes PPO targets (GAE) and trains the actor; owns the
policy_version clock that weight_sync publishes (S-FLOW-3, S-FLOW-6, S-CW-4).

On a GPU its model and optimizer live on the device of its group; everything it
hands to other roles (targets, receipts, published weights) is on the host, where
the object store can carry it. Sharing that device with the rollout engine
(colocated offload, S-RUN-4), it parks its state on the host after its last call of
each iteration and comes back lazily when the next batch needs the model.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch

from algorithm.advantage_estimators import EstimatorInputs, advantage_estimator
from algorithm.ppo_math import (
    adaptive_kl_coef,
    behaviour_weights,
    clipped_policy_loss,
    explained_variance,
    kl_estimate,
    kl_penalised_rewards,
    masked_mean,
    whiten,
)
from algorithm.update_plan import MicroBatch
from checkpoint.role_files import saving
from checkpoint.role_state import save_tokenizer
from configs.schema import OptimizerConfig, PPOConfig
from models.cut_forward import forward_by_tokens
from models.lora import add_adapters
from models.model_io import (
    ensure_model,
    is_vision_language,
    load_causal_lm,
    load_image_processor,
    load_tokenizer,
    response_logprobs,
    use_attention,
)
from placement.role_placement import RolePlacement
from roles.trainer_role import TrainerRole
from contracts.trajectory import PPOTargets, TrainReceipt, Trajectory
from trainer.sharding import full_weight_buckets
from weights.publication import WeightPublication, publish


class StaleSampleError(RuntimeError):
    pass


class PolicyRole(TrainerRole):
    role = "policy"

    def __init__(self, config: PPOConfig, placement: RolePlacement):
        super().__init__(config, placement)
        self.policy_version = 0
        # The KL coefficient the next batch is penalised with: fixed, or the adaptive
        # controller's state, saved with the role so a resume continues it (S-OPT-1).
        self.kl_coef = config.rl.kl_coef
        self.estimator = advantage_estimator(config.rl.advantage_estimator)
        self.parks = self.placement.parks
        self.parked = False
        if self.parks:
            # The first thing the shared GPU runs is the first rollout.
            self.park()

    def _load_model(self, config: PPOConfig) -> torch.nn.Module:
        model_path = ensure_model(config.model)
        self.tokenizer = load_tokenizer(model_path)
        # A VLM's boundary also carries its image processor, so it exports complete.
        self.image_processor = load_image_processor(model_path) if is_vision_language(model_path) else None
        model = use_attention(load_causal_lm(model_path, config.model.dtype), config.model.attention)
        if not config.model.lora.enabled:
            return model
        return add_adapters(model, config.model.lora, seed=config.job.seed, task_type="CAUSAL_LM")  # S-LORA-1

    def _learning_rate(self, optimizer: OptimizerConfig) -> float:
        return optimizer.policy_lr

    def ready(self) -> dict[str, Any]:
        return {**super().ready(), "parks": self.parks, "parked": self.parked}

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """The join's broadcast needs the weights on the GPU; parked again after (S-RUN-4)."""
        self._unpark()
        yield
        self.park()

    def park(self) -> dict[str, float]:
        """Move weights, optimizer state (and free gradients) to the host and release
        the cached GPU memory, so the rollout engine has the shared device while it
        generates (S-RUN-4). The flow queues this as the policy's last call of every
        iteration. Returns the park's cost as metrics; `{}` when the role does not
        park (a CPU run, its own GPU, or `rl.colocated_offload=false`), so such a
        run's metric records are exactly what they were before parking existed."""
        if not self.parks or self.parked:
            return {}
        started = time.perf_counter()
        # The gradients of the last minibatch are never read again: the next update
        # starts with zero_grad(set_to_none=True). Dropping them frees a model's worth.
        self.runtime.optimizer.zero_grad(set_to_none=True)
        moved = self.runtime.place("cpu")
        torch.cuda.empty_cache()
        self.parked = True
        return {"perf/policy_park_seconds": time.perf_counter() - started, "perf/policy_parked_bytes": float(moved)}

    def _unpark(self) -> None:
        """Back to the GPU before any forward or update. Saving, loading and reading
        the weights work on the host copy, so a commit between rollouts never pulls
        the trainer back onto the engine's device."""
        if self.parked:
            self.runtime.place(self.runtime.device)
            self.parked = False

    def prepare_batch(self, trajectory: Trajectory) -> tuple[PPOTargets, dict[str, float]]:
        critic_fields = ("values",) if self.estimator.uses_critic else ()
        trajectory.require("batch_id", "sequence_scores", "ref_logprobs", *critic_fields)
        self._refuse_stale(
            trajectory.policy_version, f"samples of iteration {trajectory.iteration}", self.rl.rollout.max_staleness
        )
        self._unpark()
        input_ids, attention_mask = trajectory.sequences()
        mask = trajectory.action_mask  # observations are context, never trained on (S-ENV-2)
        self.model.eval()
        with torch.no_grad():
            # Recomputed rather than taken from the engine: vLLM's numerics differ from
            # the trainer's, and the ratio must start at exactly 1. The targets are
            # frozen on the host: the critic receives the same object (S-FLOW-3).
            old_logprobs = forward_by_tokens(
                lambda ids, attention, prompt_length, rows: response_logprobs(
                    self.model, ids, attention, prompt_length, self.rl.rollout.temperature, trajectory.extras, rows,
                    pack=self.packs_rows,
                ),
                input_ids, attention_mask, trajectory.prompt_length, self.rl.micro_batch_tokens,
                keep_prompt=bool(trajectory.extras),
            ) * mask
        # A critic-free estimator (S-OPT-2) has no values: zeros, which no loss reads.
        old_values = trajectory.values * mask if self.estimator.uses_critic else torch.zeros_like(mask)
        # One reward and one GAE for every rollout (S-PATH-1): a single-turn row is a one-turn episode.
        kl_coef = self.kl_coef
        rewards, kl = kl_penalised_rewards(
            trajectory.token_scores, old_logprobs, trajectory.ref_logprobs, mask,
            kl_coef if self.rl.kl_in == "reward" else 0.0, self.rl.kl_estimator,
        )
        kl_metrics = self._adapt_kl_coef(kl, input_ids.shape[0])
        advantages, returns = self.estimator.compute(EstimatorInputs(
            rewards, old_values if self.estimator.uses_critic else None, mask,
            torch.tensor(trajectory.prompts.group_index()), self.rl.gamma, self.rl.lam, self.rl.grpo_scale is not False,
        ))
        whitens = self.estimator.whitens if self.rl.whiten_advantages is None else self.rl.whiten_advantages
        if whitens:
            advantages = whiten(advantages, mask)
        weights, weight_metrics = self._importance_weights(old_logprobs, trajectory, mask)
        self.targets = PPOTargets(
            batch_id=trajectory.batch_id,
            iteration=trajectory.iteration,
            policy_version=self.policy_version,
            input_ids=input_ids,
            attention_mask=attention_mask,
            prompt_length=trajectory.prompt_length,
            response_mask=mask,
            old_logprobs=old_logprobs,
            old_values=old_values,
            advantages=advantages,
            returns=returns,
            extras=trajectory.extras,  # the packed pixels, for the policy's and the critic's minibatches
            behaviour_weights=weights,
            ref_logprobs=trajectory.ref_logprobs if self.rl.kl_in == "loss" else None,
            kl_coef=kl_coef if self.rl.kl_in == "loss" else None,
        )
        return self.targets, {
            **weight_metrics,
            **kl_metrics,
            "train/kl": float((kl.sum(dim=1)).mean()),
            "train/advantage_mean": float(masked_mean(advantages, mask)),
            "train/return_mean": float(masked_mean(returns, mask)),
            **({"train/explained_variance": explained_variance(old_values, returns, mask)}
               if self.estimator.uses_critic else {}),
            "rollout/logprob_abs_diff": float(masked_mean((old_logprobs - trajectory.rollout_logprobs).abs(), mask)),
        }

    def _importance_weights(
        self, old_logprobs: torch.Tensor, trajectory: Trajectory, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The one frozen per-token weight on the surrogate, min(π_old/π_engine, cap) over
        the engine's sampling log-probs (b, r), or None: one step off it is decoupled
        PPO's π_prox/π_behav (S-ASYNC-2); with `rl.rollout.engine_mismatch_cap` the same
        truncated ratio corrects the engine's numerics (Yao et al. 2025, TIS; S-OPT-1).
        The config refuses both at once, so a token is never weighted twice."""
        rollout = self.rl.rollout
        if rollout.max_staleness > 0:  # the samples may come from an older policy
            weights, truncated = behaviour_weights(
                old_logprobs, trajectory.rollout_logprobs, mask, rollout.behaviour_weight_cap
            )
            return weights, {
                "rollout/staleness": float(self.policy_version - trajectory.policy_version),
                "train/behaviour_weight_mean": float(masked_mean(weights, mask)),
                "train/behaviour_weight_truncated_fraction": float(truncated),
            }
        if rollout.engine_mismatch_cap is not None:
            weights, truncated = behaviour_weights(
                old_logprobs, trajectory.rollout_logprobs, mask, rollout.engine_mismatch_cap
            )
            return weights, {
                "train/engine_mismatch_weight_mean": float(masked_mean(weights, mask)),
                "train/engine_mismatch_truncated_fraction": float(truncated),
            }
        return None, {}

    def _adapt_kl_coef(self, kl: torch.Tensor, samples: int) -> dict[str, float]:
        """With `rl.kl_target`, the controller's step after this batch (Ziegler et al.
        2019) and the coefficient this batch was penalised with, `train/kl_coef`.
        It steps during critic warmup too: every iteration's batch is penalised, and the
        step is a pure function of that batch, so warmup and resume stay deterministic."""
        if self.rl.kl_target is None:
            return {}
        used = self.kl_coef
        mean_sequence_kl = float(kl.sum(dim=1).mean())
        self.kl_coef = adaptive_kl_coef(used, mean_sequence_kl, self.rl.kl_target, self.rl.kl_horizon, samples)
        return {"train/kl_coef": used}

    def _loss(self, targets: PPOTargets, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped surrogate per token (m, r') of one micro-batch; the runtime
        aggregates it (S-PATH-2). Diagnostics are token means over its rows."""
        input_ids, attention_mask, prompt_length = micro.sequences(
            targets.input_ids, targets.attention_mask, targets.prompt_length
        )
        rl = self.rl
        logprobs, entropy = response_logprobs(
            self.model, input_ids, attention_mask, prompt_length,
            rl.rollout.temperature, targets.extras, micro.rows, with_entropy=True, pack=self.packs_rows,
            entropy_grad=rl.entropy_coef > 0,
        )
        kl_to_reference = None
        if targets.ref_logprobs is not None:  # rl.kl_in=loss: KL(π_θ || π_ref) per token, with gradient
            kl_to_reference = kl_estimate(logprobs, micro.response(targets.ref_logprobs), rl.kl_estimator)
        output = clipped_policy_loss(
            logprobs, micro.response(targets.old_logprobs), micro.response(targets.advantages),
            micro.response(targets.response_mask), rl.clip_ratio, entropy,
            None if targets.behaviour_weights is None else micro.response(targets.behaviour_weights),
            clip_ratio_high=rl.clip_ratio_high, dual_clip=rl.dual_clip, entropy_coef=rl.entropy_coef,
            kl_to_reference=kl_to_reference, kl_coef=targets.kl_coef or 0.0,
        )
        diagnostics = {
            "loss": output.loss.detach(),
            "clip_fraction": output.clip_fraction,
            "approx_kl": output.approx_kl,
            "ratio_mean": output.ratio_mean,
            "entropy": output.entropy,
        }
        for name in ("clip_fraction_low", "clip_fraction_high", "dual_clip_fraction", "kl_loss"):
            if (value := getattr(output, name)) is not None:  # only with the option on (S-OPT-1)
                diagnostics[name] = value
        return output.per_token, diagnostics

    def _admit(self, targets: PPOTargets, batch_id: str) -> None:
        # At the train step too: targets frozen under one version must not train weights
        # that were published as another.
        self._refuse_stale(targets.policy_version, f"the targets of batch {batch_id}")
        self._unpark()

    def _train_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        named = {f"train/policy_{k}": v for k, v in metrics.items() if k not in ("lr", "padding_fraction")}
        # The critic's forwards run the very same micro-batches: the policy reports it once (S-PATH-3).
        named["perf/padding_fraction"] = metrics["padding_fraction"]
        return named

    def install_targets(self, targets: PPOTargets) -> dict[str, str]:
        """Ranks 1.. of a data-parallel policy (S-FLOW-5), refusing targets frozen under
        another policy_version (S-FLOW-6)."""
        self._refuse_stale(targets.policy_version, f"the targets of batch {targets.batch_id}")
        return super().install_targets(targets)

    def _refuse_stale(self, sample_version: int, what: str, max_staleness: int = 0) -> None:
        """The staleness guard, here and only here: samples may lag the policy by at most
        `rl.rollout.max_staleness` versions (S-FLOW-6, S-ASYNC-1); targets must have been
        frozen under the very version they train (the default, 0)."""
        if not 0 <= self.policy_version - sample_version <= max_staleness:
            allowed = "" if max_staleness == 0 else f" (rl.rollout.max_staleness={max_staleness})"
            raise StaleSampleError(
                f"policy rank {self.rank} refuses {what}: they come from policy_version {sample_version}, "
                f"the policy is at {self.policy_version}{allowed}"
            )

    def publish_weights(self, *after: TrainReceipt) -> tuple[WeightPublication, int]:
        """Advance the policy_version clock and hand out the weights that carry it
        (S-FLOW-6). Only weight_sync calls this, on every rank at once, and only after
        an actor update: the full weights are gathered from the ranks' shards once per
        version, bucket by bucket (S-SCALE-3); rank 0 publishes the buckets, the other
        ranks an empty publication and their own (equal) clock.

        The flow queues this call before training has finished and passes every
        rank's training receipt reference as `after`: if any rank failed, Ray fails
        this call too instead of publishing untrained weights under a new version."""
        held = self.targets.batch_id if self.targets is not None else None
        for receipt in after:
            if receipt.batch_id != held:
                raise ValueError(
                    f"policy rank {self.rank} was asked to publish after rank {receipt.rank} trained on "
                    f"{receipt.batch_id}, but holds targets for {held}"
                )
        self.policy_version += 1
        return self._published_weights(), self.policy_version

    def current_weights(self) -> tuple[WeightPublication, int]:
        """The weights and version as they stand (after a restore), without
        advancing the clock; like publish_weights, every rank calls it at once."""
        return self._published_weights(), self.policy_version

    def _published_weights(self) -> WeightPublication:
        """The full weights as host buckets of at most `rl.rollout.weight_sync_bucket_mib`
        (weights/publication.py); on the host and unsharded, the model's own
        tensors (`.cpu()` copies nothing) until the object store takes each bucket."""
        bucket_bytes = int(self.rl.rollout.weight_sync_bucket_mib * 2**20)
        return publish(
            full_weight_buckets(self.model, keep=self.rank == 0, bucket_bytes=bucket_bytes),
            transport=self.rl.weight_sync_transport, version=self.policy_version,
            loopback=self.config.grid.num_nodes == 1,
        )

    def _saved_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"policy_version": self.policy_version}
        if self.rl.kl_target is not None:  # saved with the controller only: a fixed coefficient is the config's
            state["kl_coef"] = self.kl_coef
        return state

    def save(self, directory: str, plan: str = "full") -> dict[str, Any]:
        report = super().save(directory, plan)
        if plan != "model" and self.rank == 0:
            with saving("policy", directory):
                save_tokenizer(self.tokenizer, directory)  # the boundary exports as a complete HF model
                if self.image_processor is not None:
                    save_tokenizer(self.image_processor, directory)  # same file copy, for preprocessor_config.json
        return report

    def load(self, directory: str) -> dict[str, Any]:
        state = super().load(directory)
        self.policy_version = int(state["policy_version"])
        # A boundary written without the controller starts it from rl.kl_coef.
        adaptive = self.rl.kl_target is not None
        self.kl_coef = float(state.get("kl_coef", self.rl.kl_coef)) if adaptive else self.rl.kl_coef
        return state

    def export_boundary(self, boundary: str, out: str) -> dict[str, str]:
        """The final export (checkpoint/export.py) in this process, where transformers
        is already imported; it reads the committed boundary, not this role's state."""
        from checkpoint.export import export_boundary

        return export_boundary(boundary, out)

    def update_counts(self) -> dict[str, int]:
        """Published versions and optimizer steps as this role holds them: the run's
        summary reports whether the actor was updated from these, not from config."""
        return {"policy_version": self.policy_version, "optimizer_step": self.runtime.optimizer_step}
