"""The policy role: freezes PPO targets (GAE) and trains the actor; owns the
policy_version clock that weight_sync publishes (S-FLOW-3, S-FLOW-6, S-CW-4).

On a GPU its model and optimizer live on the device of its group; everything it
hands to other roles (targets, receipts, published weights) is on the host, where
the object store can carry it. Sharing that device with the rollout engine
(colocated offload, S-RUN-4), it parks its state on the host after its last call of
each iteration and comes back lazily when the next batch needs the model.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch

from algorithm.ppo_math import (
    clipped_policy_loss,
    explained_variance,
    generalized_advantage_estimate,
    kl_penalised_rewards,
    masked_mean,
    whiten,
)
from algorithm.update_plan import UpdatePlan
from configs.schema import PPOConfig
from checkpoint.role_state import save_tokenizer, saving
from roles.model_io import (
    ensure_model,
    is_vision_language,
    load_causal_lm,
    load_image_processor,
    load_tokenizer,
    response_logprobs,
)
from roles.data_parallel import rendezvous_address
from roles.placement import parks_between_updates, plan_placement, role_device
from roles.runtime import configure_torch_threads
from roles.trajectory import PPOTargets, TrainReceipt, Trajectory
from roles.update_runtime import UpdateRuntime


class StaleSampleError(RuntimeError):
    pass


class PolicyRole:
    def __init__(self, config: PPOConfig, rank: int = 0):
        configure_torch_threads(config.rl.threads_per_role)
        self.config = config
        self.rank = rank
        self.rl = config.rl
        model_path = ensure_model(config.model)
        self.tokenizer = load_tokenizer(model_path)
        # A VLM's boundary also carries its image processor, so it exports complete.
        self.image_processor = load_image_processor(model_path) if is_vision_language(model_path) else None
        model = load_causal_lm(model_path, config.model.dtype)
        device = role_device(config, "policy")
        self.runtime = UpdateRuntime("policy", model, config.rl.optimizer, config.rl.optimizer.policy_lr, device)
        self.policy_version = 0
        self.targets: PPOTargets | None = None
        self.parks = parks_between_updates(plan_placement(config), "policy", device)
        self.parked = False
        if self.parks:
            # The first thing the shared GPU runs is the first rollout.
            self.park()

    @property
    def model(self) -> torch.nn.Module:
        return self.runtime.model

    def ready(self) -> dict[str, Any]:
        return {
            "role": "policy",
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "device": str(self.runtime.device),
            "parks": self.parks,
            "parked": self.parked,
            "rank": self.rank,
            "ranks": self.runtime.data_parallel.world,
        }

    def rendezvous_address(self) -> str:
        """Rank 0's listening address for its role's process group."""
        return rendezvous_address()

    def join_data_parallel(self, address: str, rank: int, world: int) -> dict[str, Any]:
        """Join the policy's process group (every rank at once) and take rank 0's weights."""
        self._unpark()  # NCCL broadcasts device tensors
        self.runtime.join_data_parallel(address, rank, world)
        self.park()
        return self.ready()

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
        trajectory.require("batch_id", "scores", "ref_logprobs", "values")
        if trajectory.policy_version != self.policy_version:
            raise StaleSampleError(
                f"policy refuses samples of iteration {trajectory.iteration}: they were generated by "
                f"policy_version {trajectory.policy_version}, the policy is at {self.policy_version}"
            )
        self._unpark()
        input_ids, attention_mask = trajectory.sequences()
        mask = trajectory.response_mask
        self.model.eval()
        with torch.no_grad():
            # Recomputed rather than taken from the engine: vLLM's numerics differ from
            # the trainer's, and the ratio must start at exactly 1. The targets are
            # frozen on the host: the critic receives the same object (S-FLOW-3).
            old_logprobs = response_logprobs(
                self.model, input_ids, attention_mask, trajectory.prompt_length, self.rl.rollout.temperature,
                trajectory.extras,
            ).cpu() * mask
        rewards, kl = kl_penalised_rewards(
            trajectory.scores, old_logprobs, trajectory.ref_logprobs, mask, self.rl.kl_coef, trajectory.process_rewards
        )
        old_values = trajectory.values * mask
        advantages, returns = generalized_advantage_estimate(rewards, old_values, mask, self.rl.gamma, self.rl.lam)
        if self.rl.whiten_advantages:
            advantages = whiten(advantages, mask)
        self.targets = PPOTargets(
            batch_id=trajectory.batch_id,
            iteration=trajectory.iteration,
            policy_version=trajectory.policy_version,
            input_ids=input_ids,
            attention_mask=attention_mask,
            prompt_length=trajectory.prompt_length,
            response_mask=mask,
            old_logprobs=old_logprobs,
            old_values=old_values,
            advantages=advantages,
            returns=returns,
            extras=trajectory.extras,  # the packed pixels, for the policy's and the critic's minibatches
        )
        return self.targets, {
            "train/kl": float((kl.sum(dim=1)).mean()),
            "train/advantage_mean": float(masked_mean(advantages, mask)),
            "train/return_mean": float(masked_mean(returns, mask)),
            "train/explained_variance": explained_variance(old_values, returns, mask),
            "rollout/logprob_abs_diff": float(masked_mean((old_logprobs - trajectory.rollout_logprobs).abs(), mask)),
        }

    def _loss(self, targets: PPOTargets, index: torch.Tensor):
        logprobs, entropy = response_logprobs(
            self.model, targets.input_ids[index], targets.attention_mask[index], targets.prompt_length,
            self.rl.rollout.temperature, targets.extras, index, with_entropy=True,
        )
        output = clipped_policy_loss(
            logprobs, targets.old_logprobs[index], targets.advantages[index], targets.response_mask[index],
            self.rl.clip_ratio, entropy,
        )
        return output.loss, {
            "loss": output.loss.detach(),
            "clip_fraction": output.clip_fraction,
            "approx_kl": output.approx_kl,
            "ratio_mean": output.ratio_mean,
            "entropy": output.entropy,
        }

    def train_batch(self, plan: UpdatePlan, batch_id: str) -> TrainReceipt:
        if self.targets is None or self.targets.batch_id != batch_id:
            held = self.targets.batch_id if self.targets else None
            raise ValueError(f"policy was asked to train on batch {batch_id} but holds targets for {held}")
        if self.targets.policy_version != self.policy_version:
            # S-FLOW-6 at the train step too: targets frozen under one version must not
            # train weights that were published as another.
            raise StaleSampleError(
                f"policy refuses to train on batch {batch_id}: its targets were prepared from samples of "
                f"policy_version {self.targets.policy_version}, the policy is at {self.policy_version}"
            )
        self._unpark()
        started = time.perf_counter()
        metrics = self.runtime.run_plan(plan, self.targets, self._loss)
        named = {f"train/policy_{k}": v for k, v in metrics.items() if k != "lr"}
        named["optim/policy_lr"] = metrics["lr"]
        named["optim/policy_optimizer_step"] = float(self.runtime.optimizer_step)
        named["perf/policy_train_seconds"] = time.perf_counter() - started
        if self.runtime.last_allreduce_seconds is not None:  # only with data-parallel ranks
            named["perf/policy_allreduce_seconds"] = self.runtime.last_allreduce_seconds
        return TrainReceipt("policy", batch_id, self.rank, self.runtime.optimizer_step, named)

    def install_targets(self, targets: PPOTargets) -> dict[str, str]:
        """Ranks 1.. of a data-parallel policy: keep rank 0's frozen targets under their
        batch id, the key the controller hands back to train_batch (S-FLOW-5)."""
        if targets.policy_version != self.policy_version:
            raise StaleSampleError(
                f"policy rank {self.rank} refuses targets of batch {targets.batch_id}: prepared under policy_version "
                f"{targets.policy_version}, this rank is at {self.policy_version}"
            )
        self.targets = targets
        return {"batch_id": targets.batch_id}

    def publish_weights(self, *after: TrainReceipt) -> tuple[dict[str, torch.Tensor], int]:
        """Advance the policy_version clock and hand out the weights that carry it
        (S-FLOW-6). Only weight_sync calls this, on rank 0, and only after an actor update.

        The flow queues this call before training has finished and passes every
        rank's training receipt reference as `after`: if any rank failed, Ray fails
        this call too instead of publishing untrained weights under a new version."""
        held = self.targets.batch_id if self.targets is not None else None
        for receipt in after:
            if receipt.batch_id != held:
                raise ValueError(
                    f"policy was asked to publish after rank {receipt.rank} trained on {receipt.batch_id}, "
                    f"but holds targets for {held}"
                )
        self.policy_version += 1
        return self._host_weights(), self.policy_version

    def follow_version(self, version: int) -> int:
        """Ranks 1..: take the version rank 0 published; their weights are already the
        same (identical all-reduced steps), only the clock is rank 0's to advance."""
        if version != self.policy_version + 1:
            raise ValueError(f"policy rank {self.rank} is at policy_version {self.policy_version}, asked to follow {version}")
        self.policy_version = version
        return version

    def current_weights(self) -> tuple[dict[str, torch.Tensor], int]:
        """The weights and version as they stand (after a restore), without
        advancing the clock."""
        return self._host_weights(), self.policy_version

    def _host_weights(self) -> dict[str, torch.Tensor]:
        """The weights as host tensors for the object store (S-FLOW-6); on the host,
        the model's own tensors (`.cpu()` copies nothing there)."""
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def save(self, directory: str, plan: str = "full"):
        if plan == "model":
            return {"path": self.runtime.save_model(directory)}
        report = asdict(self.runtime.save(directory, {"policy_version": self.policy_version}))
        with saving("policy", directory):
            save_tokenizer(self.tokenizer, directory)  # the boundary exports as a complete HF model
            if self.image_processor is not None:
                save_tokenizer(self.image_processor, directory)  # same file copy, for preprocessor_config.json
        return report

    def load(self, directory: str) -> dict[str, Any]:
        state = self.runtime.load(directory)
        self.policy_version = int(state["policy_version"])
        self.targets = None
        return state

    def update_counts(self) -> dict[str, int]:
        """Published versions and optimizer steps as this role holds them: the run's
        summary reports whether the actor was updated from these, not from config."""
        return {"policy_version": self.policy_version, "optimizer_step": self.runtime.optimizer_step}
