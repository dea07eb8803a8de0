"""Every key a run writes into metrics.jsonl, once: what it means, its unit, and when a
record carries it. `docs/reference/metrics.md` is generated from this list
(`python -m algorithm.metrics_catalogue > docs/reference/metrics.md`) and a test runs
a real iteration loop and checks its records against it, so neither can drift.

No torch, Ray or Prefect here: the doc generator and the tests read it cheaply.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts.rollout_faults import LOST_KEY, REPLACE_SECONDS_KEY

# When a record carries a key. A missing key is information ("the actor did not
# update"), never a zero written in its place.
EVERY_ITERATION = "every iteration"
ACTOR_UPDATES = "iterations where the actor updates (not during critic warmup)"
WITH_MATCHER = "every iteration with a terminal matcher (absent with rl.reward.terminal=none: no verdict)"
ON_ERROR_ZERO = "every iteration with rl.reward.on_error=zero"
DATA_PARALLEL = "only with data-parallel trainer ranks (more than one rank of that role)"
POLICY_PARKS = "only when the policy parks between updates (colocated GPU with rl.colocated_offload)"
SEVERAL_ENGINES = "only with more than one rollout engine"
ELASTIC = (
    "only with more than one rollout engine and elastic rollout on (rl.rollout.max_engine_replacements > 0)"
)
ONE_STEP_OFF = "only one step off (rl.rollout.max_staleness=1, S-ASYNC)"
OVER_NIXL = "iterations where the actor updates, with rl.weight_sync_transport=nixl"
SAVE_ITERATIONS = "save iterations only (rl.save_every, and the final iteration with rl.save_final)"
EVALUATIONS = (
    "evaluation iterations only (rl.validation: every rl.validation.every-th iteration, and iteration 0 with "
    "rl.validation.before_training)"
)
WITH_REFERENCES = "only when every evaluation prompt has a reference"
REWARD_MODEL = "every iteration with a reward model (rl.reward.model)"
RM_NORMALIZE = "every iteration with rl.reward.model.normalize"
RM_CLIP = "every iteration with rl.reward.model.clip set"
RM_EOS_PENALTY = "every iteration with rl.reward.model.missing_eos_penalty set"
ENVIRONMENT = "every iteration with a multi-turn environment (rl.env)"
ADAPTIVE_KL = "every iteration with the adaptive KL coefficient (rl.kl_target set)"
CLIP_HIGHER = "with an upper clip of its own (rl.clip_ratio_high set)"
DUAL_CLIP = "with the dual clip (rl.dual_clip set)"
KL_IN_LOSS = "with the KL in the policy loss (rl.kl_in=loss)"
ENGINE_MISMATCH = "every iteration with the engine-mismatch correction (rl.rollout.engine_mismatch_cap set)"
WITH_CRITIC = "every iteration of a run with a critic (rl.advantage_estimator=gae; critic-free estimators have none)"

WHEN: tuple[str, ...] = (
    EVERY_ITERATION, ACTOR_UPDATES, WITH_MATCHER, DATA_PARALLEL, POLICY_PARKS, SEVERAL_ENGINES, SAVE_ITERATIONS,
    EVALUATIONS, WITH_REFERENCES, ONE_STEP_OFF, OVER_NIXL, ELASTIC, ON_ERROR_ZERO, REWARD_MODEL, RM_NORMALIZE,
    RM_CLIP, RM_EOS_PENALTY, ENVIRONMENT, ADAPTIVE_KL, CLIP_HIGHER, DUAL_CLIP, KL_IN_LOSS, ENGINE_MISMATCH,
    WITH_CRITIC,
)


@dataclass(frozen=True)
class Metric:
    key: str  # exactly as written in metrics.jsonl
    meaning: str
    unit: str
    when: str | tuple[str, ...]  # one of WHEN, or several that must all hold
    source: str  # who writes it, for a reader looking for the code

    @property
    def conditions(self) -> tuple[str, ...]:
        return (self.when,) if isinstance(self.when, str) else self.when


def _stage_time(stage: str, what: str, when: str = EVERY_ITERATION) -> Metric:
    return Metric(f"time/{stage}_seconds", f"wall-clock seconds of the {stage} stage as the flow saw it: {what}",
                  "seconds", when, "flows/iteration.py")


METRICS: tuple[Metric, ...] = (
    Metric("iteration", "the outer iteration: the metric step and the checkpoint boundary's name",
           "count (from 1)", EVERY_ITERATION, "flows/iteration.py"),
    # data
    Metric("data/epoch", "the data cursor's epoch after this batch was drawn", "count (from 0)",
           EVERY_ITERATION, "roles/data_role.py"),
    Metric("data/position", "the data cursor's row position within the epoch after this batch was drawn",
           "rows", EVERY_ITERATION, "roles/data_role.py"),
    # rollout
    Metric("rollout/response_length_mean", "mean generated length over the batch (up to and including EOS)",
           "tokens", EVERY_ITERATION, "roles/rollout_role.py"),
    Metric("rollout/generate_seconds", "time inside the engine's generate (the slowest engine's, with several)",
           "seconds", EVERY_ITERATION, "roles/rollout_role.py"),
    Metric("rollout/policy_version", "the policy version whose weights sampled this batch",
           "version number", EVERY_ITERATION, "roles/rollout_role.py"),
    Metric("rollout/engines", "how many rollout engines generated a shard of the batch", "count",
           SEVERAL_ENGINES, "roles/rollout_role.py"),
    Metric("rollout/logprob_abs_diff",
           "mean |trainer log-prob − engine log-prob| over response tokens: how far the engine's numerics are "
           "from the trainer's", "nats", EVERY_ITERATION, "roles/policy_role.py"),
    Metric(LOST_KEY, "rollout engines lost (process gone, or no answer within "
           "rl.rollout.engine_timeout_seconds) while this batch was generated; each lost shard was generated again "
           "on a surviving engine with its own seed and version", "count", ELASTIC, "processes/engine_pool.py"),
    Metric(REPLACE_SECONDS_KEY, "start-up and weight-load seconds of the replacement engines that "
           "began serving before this batch (a replacement starts while the iteration that lost the engine trains); "
           "0 when none did", "seconds", ELASTIC, "processes/engine_pool.py"),
    Metric("perf/rollout_weight_loads", "weight loads engine 0 has received since its process started "
           "(process-local: restarts with the actor)", "count", EVERY_ITERATION, "roles/rollout_role.py"),
    # reward
    Metric("train/reward_mean", "mean terminal reward of the batch on PPO's scale", "reward",
           EVERY_ITERATION, "roles/reward_role.py"),
    Metric("reward/terminal_mean", "mean terminal reward of the batch (same value as train/reward_mean)",
           "reward", EVERY_ITERATION, "roles/reward_role.py"),
    Metric("reward/process_mean", "mean per-sequence sum of the process shaping term", "reward",
           EVERY_ITERATION, "roles/reward_role.py"),
    Metric("reward/fraction_correct",
           "fraction of completions the terminal matcher judged correct (a full score of 1.0; its verdict, "
           "not a comparison of rewards)", "fraction in [0, 1]", WITH_MATCHER, "roles/reward_role.py"),
    Metric("reward/errors", "completions on which the terminal rule or callable raised, scored as incorrect "
           "(the first few are logged with their rows)", "count", ON_ERROR_ZERO, "roles/reward_role.py"),
    # learned reward model (S-RM-1)
    Metric("reward/model_raw_mean", "mean raw score of the batch's completions from the reward model (its logit)",
           "model score", REWARD_MODEL, "algorithm/reward_model_scores.py"),
    Metric("reward/model_raw_std", "population standard deviation of the raw reward-model scores of the batch",
           "model score", REWARD_MODEL, "algorithm/reward_model_scores.py"),
    Metric("reward/model_normalized_mean", "mean score after the running normalisation (s - mean) / std over "
           "every training score so far, this batch included", "standard deviations", RM_NORMALIZE,
           "algorithm/reward_model_scores.py"),
    Metric("reward/model_clipped_fraction", "fraction of scores outside [-clip, clip] after normalising, clipped "
           "to it", "fraction in [0, 1]", (REWARD_MODEL, RM_CLIP), "algorithm/reward_model_scores.py"),
    Metric("reward/model_penalized_fraction", "fraction of completions that ended without EOS and paid "
           "rl.reward.model.missing_eos_penalty", "fraction in [0, 1]", (REWARD_MODEL, RM_EOS_PENALTY),
           "algorithm/reward_model_scores.py"),
    Metric("reward/model_score_mean", "mean of the reward model's term of the terminal reward (normalised, "
           "clipped, penalised, weighted); with combine=model this is train/reward_mean", "reward", REWARD_MODEL,
           "algorithm/reward_model_scores.py"),
    # critic predictions and the frozen targets
    Metric("critic/value_mean", "mean critic prediction over response tokens, before this iteration's update",
           "reward", WITH_CRITIC, "roles/critic_role.py"),
    Metric("rollout/staleness", "policy versions between the weights that generated the batch and the policy "
           "that trains on it (0 in the first iteration and during critic warmup, then 1)", "versions",
           ONE_STEP_OFF, "roles/policy_role.py"),
    Metric("train/behaviour_weight_mean", "mean decoupled-PPO importance weight pi_prox/pi_behav over response "
           "tokens, after truncation at rl.rollout.behaviour_weight_cap (1 when nothing lags)", "ratio",
           ONE_STEP_OFF, "roles/policy_role.py"),
    Metric("train/behaviour_weight_truncated_fraction", "fraction of response tokens whose importance weight "
           "pi_prox/pi_behav exceeded rl.rollout.behaviour_weight_cap and was truncated to it", "fraction",
           ONE_STEP_OFF, "roles/policy_role.py"),
    Metric("train/engine_mismatch_weight_mean", "mean engine-mismatch weight min(π_old/π_engine, "
           "rl.rollout.engine_mismatch_cap) over response tokens, π_engine the engine's sampling probability of the "
           "token (1 where engine and trainer agree)", "ratio", ENGINE_MISMATCH, "roles/policy_role.py"),
    Metric("train/engine_mismatch_truncated_fraction", "fraction of response tokens whose π_old/π_engine exceeded "
           "rl.rollout.engine_mismatch_cap and was truncated to it", "fraction in [0, 1]", ENGINE_MISMATCH,
           "roles/policy_role.py"),
    Metric("train/kl", "mean per-sequence sum over response tokens of the rl.kl_estimator estimate of "
           "KL(π_old ‖ π_ref) (k1, the default: log π_old − log π_ref); the KL penalty's estimate, and what the "
           "adaptive coefficient follows", "nats", EVERY_ITERATION, "roles/policy_role.py"),
    Metric("train/kl_coef", "the KL coefficient this iteration's batch was penalised with (in the reward, or in "
           "the loss with rl.kl_in=loss); the adaptive controller then steps it for the next iteration, critic "
           "warmup included", "coefficient", ADAPTIVE_KL, "roles/policy_role.py"),
    Metric("train/advantage_mean", "mean advantage over response tokens (after whitening when enabled)",
           "reward", EVERY_ITERATION, "roles/policy_role.py"),
    Metric("train/return_mean", "mean return over response tokens: GAE's, the critic's target (a critic-free "
           "estimator reports its own advantages before whitening)", "reward", EVERY_ITERATION,
           "roles/policy_role.py"),
    Metric("train/explained_variance", "1 − Var(R − V)/Var(R) of the critic's predictions: 1 is perfect, "
           "≤ 0 no better than a constant", "ratio", WITH_CRITIC, "roles/policy_role.py"),
    # the policy's update
    Metric("train/policy_loss", "PPO-clip surrogate loss (with the KL term and entropy bonus when configured) "
           "as the gradient sees it: each minibatch's loss under rl.loss_aggregation, averaged over minibatches; "
           "the same however the minibatch is cut", "loss", ACTOR_UPDATES, "trainer/update_runtime.py"),
    Metric("train/policy_clip_fraction", "fraction of response tokens where the ratio was clipped",
           "fraction in [0, 1]", ACTOR_UPDATES, "roles/policy_role.py"),
    Metric("train/policy_clip_fraction_low", "fraction of response tokens with a negative advantage whose ratio "
           "was clipped at 1 − rl.clip_ratio (the lower clip's share of train/policy_clip_fraction)",
           "fraction in [0, 1]", (ACTOR_UPDATES, CLIP_HIGHER), "roles/policy_role.py"),
    Metric("train/policy_clip_fraction_high", "fraction of response tokens with a positive advantage whose ratio "
           "was clipped at 1 + rl.clip_ratio_high (the upper clip's share of train/policy_clip_fraction)",
           "fraction in [0, 1]", (ACTOR_UPDATES, CLIP_HIGHER), "roles/policy_role.py"),
    Metric("train/policy_dual_clip_fraction", "fraction of response tokens with a negative advantage A whose loss "
           "was capped at −rl.dual_clip·A", "fraction in [0, 1]", (ACTOR_UPDATES, DUAL_CLIP),
           "roles/policy_role.py"),
    Metric("train/policy_kl_loss", "mean per-token rl.kl_estimator estimate of KL(π_θ ‖ π_ref) over response "
           "tokens during the update: the loss's KL term before rl.kl_coef", "nats", (ACTOR_UPDATES, KL_IN_LOSS),
           "roles/policy_role.py"),
    Metric("train/policy_approx_kl", "k3 estimate of KL(π_old ‖ π_θ) over response tokens during the update",
           "nats", ACTOR_UPDATES, "roles/policy_role.py"),
    Metric("train/policy_ratio_mean", "mean π_θ/π_old over response tokens during the update", "ratio",
           ACTOR_UPDATES, "roles/policy_role.py"),
    Metric("train/policy_entropy", "mean per-token entropy of π_θ over response tokens, at the rollout "
           "temperature, from the loss's own forward (the bonus's entropy with rl.entropy_coef)", "nats",
           ACTOR_UPDATES, "roles/policy_role.py"),
    Metric("train/policy_grad_norm", "policy gradient norm before clipping, mean over optimizer steps", "norm",
           ACTOR_UPDATES, "trainer/update_runtime.py"),
    Metric("optim/policy_lr", "the policy's learning rate after this update", "learning rate", ACTOR_UPDATES,
           "roles/policy_role.py"),
    Metric("optim/policy_optimizer_step", "optimizer steps the policy has taken in the whole run", "count",
           ACTOR_UPDATES, "roles/policy_role.py"),
    Metric("perf/policy_train_seconds", "the policy's time in train_batch (rank 0)", "seconds", ACTOR_UPDATES,
           "roles/policy_role.py"),
    Metric("perf/policy_grad_sync_seconds", "rank 0's time in the policy's backward passes that reduce-scatter "
           "gradients over the FSDP2 ranks (the last micro-batch of each minibatch, compute included)", "seconds",
           (DATA_PARALLEL, ACTOR_UPDATES), "roles/policy_role.py"),
    Metric("perf/padding_fraction", "padding slots over all token slots of the policy's training forwards "
           "(every micro-batch of every rank): what rl.micro_batch_tokens' length grouping and trimming save "
           "(0 where micro-batches run packed); the critic runs the same micro-batches", "fraction in [0, 1]",
           ACTOR_UPDATES, "trainer/update_runtime.py"),
    # the critic's update
    Metric("train/value_loss", "clipped value loss as the gradient sees it: each minibatch's loss under "
           "rl.loss_aggregation, averaged over minibatches (like train/policy_loss)", "loss", WITH_CRITIC,
           "trainer/update_runtime.py"),
    Metric("train/value_clip_fraction", "fraction of response tokens where the clipped value error was larger",
           "fraction in [0, 1]", WITH_CRITIC, "roles/critic_role.py"),
    Metric("train/critic_grad_norm", "critic gradient norm before clipping, mean over optimizer steps", "norm",
           WITH_CRITIC, "roles/critic_role.py"),
    Metric("optim/critic_lr", "the critic's learning rate after this update", "learning rate", WITH_CRITIC,
           "roles/critic_role.py"),
    Metric("optim/critic_optimizer_step", "optimizer steps the critic has taken in the whole run", "count",
           WITH_CRITIC, "roles/critic_role.py"),
    Metric("perf/critic_train_seconds", "the critic's time in train_batch (rank 0)", "seconds", WITH_CRITIC,
           "roles/critic_role.py"),
    Metric("perf/critic_grad_sync_seconds", "rank 0's time in the critic's backward passes that reduce-scatter "
           "gradients over the FSDP2 ranks (the last micro-batch of each minibatch, compute included)", "seconds",
           DATA_PARALLEL, "roles/critic_role.py"),
    # weights and the park
    Metric("perf/weight_sync_bytes", "bytes of policy weights engine 0 loaded", "bytes", ACTOR_UPDATES,
           "roles/rollout_role.py"),
    Metric("perf/weight_sync_buckets", "buckets the new weights reached engine 0 in, each fetched and copied in "
           "before the next (rl.rollout.weight_sync_bucket_mib)", "count", ACTOR_UPDATES,
           "roles/rollout_role.py"),
    Metric("perf/weight_sync_nixl_bytes", "bytes engine 0 read from the policy's registered memory over NIXL "
           "(the buckets with their version headers and alignment): none of them went through the object store",
           "bytes", OVER_NIXL, "roles/rollout_role.py"),
    Metric("perf/weight_sync_load_seconds", "engine 0's time fetching and loading the new weights, bucket by bucket",
           "seconds", ACTOR_UPDATES, "roles/rollout_role.py"),
    Metric("perf/policy_park_seconds", "policy rank 0's time moving weights and optimizer state to the host",
           "seconds", POLICY_PARKS, "roles/policy_role.py"),
    Metric("perf/policy_parked_bytes", "bytes policy rank 0 moved to the host when parking", "bytes",
           POLICY_PARKS, "roles/policy_role.py"),
    Metric("train/actor_warmup", "1.0 on a critic-only warmup iteration, 0.0 when the actor updated",
           "1.0 or 0.0", EVERY_ITERATION, "flows/iteration.py"),
    Metric("train/policy_version", "the policy version after this iteration (unchanged during warmup)",
           "version number", EVERY_ITERATION, "flows/iteration.py"),
    # stage timings
    _stage_time("rollout", "data, generation and the gather of shards"),
    _stage_time("reward", "scoring and the replay buffer's add"),
    _stage_time("reference_score", "the frozen reference's log-probs"),
    _stage_time("critic_predict", "the critic's values", WITH_CRITIC),
    _stage_time("prepare_batch", "advantages, returns and the frozen targets"),
    _stage_time("train", "the policy's and the critic's updates, side by side"),
    _stage_time("weight_sync", "publishing the policy's weights to the engines and the park", ACTOR_UPDATES),
    _stage_time("evaluate", "the held-out evaluation", EVALUATIONS),
    _stage_time("commit", "the committed checkpoint boundary of this iteration", SAVE_ITERATIONS),
    _stage_time("save_artifact", "the weights-only artifact of this iteration (rl.save_plan=model)", SAVE_ITERATIONS),
    # held-out evaluation (S-OPS-2)
    Metric("val/reward_mean", "mean terminal reward of the evaluation prompts' completions, the run's own reward "
           "rule on PPO's scale", "reward", EVALUATIONS, "roles/reward_role.py"),
    Metric("val/model_raw_mean", "mean raw reward-model score of the evaluation completions (the evaluation "
           "never moves the running normalisation)", "model score", (EVALUATIONS, REWARD_MODEL),
           "roles/reward_role.py"),
    Metric("val/fraction_correct", "fraction of evaluation completions the terminal matcher judged correct",
           "fraction in [0, 1]", (EVALUATIONS, WITH_MATCHER), "roles/reward_role.py"),
    Metric("val/exact_match", "fraction of evaluation completions equal to their reference (both stripped of "
           "surrounding whitespace), whatever the reward rule", "fraction in [0, 1]",
           (EVALUATIONS, WITH_REFERENCES), "roles/reward_role.py"),
    Metric("val/response_length_mean", "mean generated length of the evaluation completions", "tokens",
           EVALUATIONS, "roles/rollout_role.py"),
    Metric("val/generate_seconds", "time inside the engine's generate for the evaluation prompts", "seconds",
           EVALUATIONS, "roles/rollout_role.py"),
    Metric("val/policy_version", "the policy version that was evaluated", "version number", EVALUATIONS,
           "roles/rollout_role.py"),
    Metric("val/prompts", "how many evaluation prompts were generated and scored", "count", EVALUATIONS,
           "roles/rollout_role.py"),
    # multi-turn environments (S-ENV)
    Metric("env/turns_mean", "assistant turns per episode, averaged over the batch", "turns", ENVIRONMENT,
           "environments/episodes.py"),
    Metric("env/tool_calls_mean", "tool calls the policy wrote per episode (parsed ones), averaged over the batch",
           "calls", ENVIRONMENT, "environments/episodes.py"),
    Metric("env/errors", "episodes ended because their environment raised, timed out or answered malformed "
           "(rl.env.on_error=end; with fail the stage fails instead)", "count", ENVIRONMENT,
           "environments/episodes.py"),
    Metric("env/tool_call_parse_errors", "tool-call blocks that did not parse; each is answered with an error "
           "message the model reads, and the episode goes on", "count", ENVIRONMENT, "environments/episodes.py"),
    Metric("env/cut_fraction", "share of episodes cut by a limit (rl.env.max_turns, max_turn_tokens or "
           "max_episode_tokens) rather than ended by the environment", "fraction in [0, 1]", ENVIRONMENT,
           "environments/episodes.py"),
    Metric("env/episode_seconds", "wall-clock seconds of the batch's episodes, generation and environment steps "
           "(the slowest engine's, with several)", "seconds", ENVIRONMENT, "environments/episodes.py"),
    Metric("env/step_wait_seconds", "of those, seconds spent waiting for environment steps (tools) to answer",
           "seconds", ENVIRONMENT, "environments/episodes.py"),
    Metric("val/turns_mean", "assistant turns per evaluation episode", "turns", (EVALUATIONS, ENVIRONMENT),
           "roles/rollout_role.py"),
    Metric("val/tool_calls_mean", "tool calls per evaluation episode", "calls", (EVALUATIONS, ENVIRONMENT),
           "roles/rollout_role.py"),
    Metric("val/cut_fraction", "share of evaluation episodes cut by a limit", "fraction in [0, 1]",
           (EVALUATIONS, ENVIRONMENT), "roles/rollout_role.py"),
    Metric("val/errors", "evaluation episodes ended by an environment error (rl.env.on_error=end)", "count",
           (EVALUATIONS, ENVIRONMENT), "roles/rollout_role.py"),
    Metric("time/iteration_seconds", "wall-clock seconds of the whole iteration", "seconds", EVERY_ITERATION,
           "flows/iteration.py"),
)

BY_KEY: dict[str, Metric] = {metric.key: metric for metric in METRICS}


def keys_when(*conditions: str) -> set[str]:
    """The keys whose conditions are exactly `conditions`."""
    return {metric.key for metric in METRICS if metric.conditions == conditions}


def uncatalogued(records: Iterable[Mapping[str, object]]) -> list[str]:
    """Keys some record carries that the catalogue does not list, sorted."""
    return sorted({key for record in records for key in record} - BY_KEY.keys())


def render() -> str:
    """docs/reference/metrics.md, from METRICS."""
    from configs.reference_doc import reference_page  # pydantic, for the doc only

    return reference_page(
        "Metrics reference",
        [
            "Generated from `algorithm/metrics_catalogue.py` by `python -m algorithm.metrics_catalogue`; do not edit",
            "by hand. Each line of a run's `metrics.jsonl` is one iteration's record; these are its keys. A key",
            "that does not apply to an iteration is absent from its record, never written as zero. With",
            "`rl.validation.before_training` the file starts with a row for iteration 0: the starting policy's",
            "evaluation, with only the `val/*` keys, `time/evaluate_seconds` and `iteration`.",
        ],
        ["key", "meaning", "unit", "in the record", "written by"],
        [f"| `{m.key}` | {m.meaning} | {m.unit} | {'; '.join(m.conditions)} | `{m.source}` |" for m in METRICS],
    )


if __name__ == "__main__":
    sys.stdout.write(render())
