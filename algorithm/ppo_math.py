"""PPO's tensor math as small pure functions.

Notation used in every shape below:
    b = number of sequences in the batch, r = response length (padded).
All per-token tensors are right-padded over the response; `mask` is 1.0 on real
response tokens (up to and including EOS) and 0.0 on padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the positions where mask is 1; shapes (b, r) and (b, r)."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance over masked positions (Bessel-corrected, like torch.var)."""
    mean = masked_mean(values, mask)
    count = mask.sum()
    centred_sq = ((values - mean) ** 2 * mask).sum()
    return centred_sq / (count - 1).clamp(min=1.0)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the masked positions; padding stays 0.

    Advantage normalisation as in the PPO implementations of OpenAI baselines and
    CleanRL (`(adv - mean) / (std + eps)`), restricted to real tokens.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio**2


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # With r = π_ref/π = exp(−log_ratio): (r − 1) − log r.
    return torch.exp(-log_ratio) - 1.0 + log_ratio


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}
"""Per-token estimators of KL(π || π_ref) from one sampled token, as functions of
log π − log π_ref (Schulman, "Approximating KL Divergence", 2020): `k1` = log(π/π_ref),
unbiased, can be negative; `k2` = ½(log r)², biased, >= 0; `k3` = (r − 1) − log r with
r = π_ref/π, unbiased, >= 0, low variance. configs/schema.py's Literal lists the same
names (tested)."""


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL(π || π_ref) estimate (b, r) from the sampled tokens' log-probs (b, r)
    under π and π_ref; differentiable in `logprobs` (verl's `kl_penalty` and OpenRLHF's
    `compute_approx_kl` compute the same three). `k1` is `logprobs − ref_logprobs`
    exactly, the penalty before `rl.kl_estimator` existed."""
    try:
        estimate = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown KL estimator {estimator!r}; known: {', '.join(KL_ESTIMATORS)}") from None
    return estimate(logprobs - ref_logprobs)


def kl_penalised_rewards(
    token_scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: −kl_coef·KL_est(π_old || π_ref) on every sampled token, plus
    the scores each token earned (Ziegler et al. 2019, eq. 2, in the per-token form of
    TRL and torchtune's `get_rewards_ppo`; verl's `apply_kl_penalty` over
    `token_level_scores`). One function for every rollout (S-PATH-1): a single-turn
    completion's terminal score sits on its last token, an episode's turn rewards on
    each turn's last sampled token, shaping on every token.

    Args:
        token_scores: (b, r) every reward term where it was earned, zero elsewhere.
        logprobs, ref_logprobs: (b, r) log-probs of the sampled tokens under the
            behaviour policy and the frozen reference.
        action_mask: (b, r) 1.0 on sampled tokens; 0.0 on observations and padding.
        kl_coef: β of the penalty (0 with the KL in the loss instead: `rl.kl_in=loss`).
        estimator: a `KL_ESTIMATORS` name; `k1` is log π_old − log π_ref.

    Returns:
        rewards (b, r) and the per-token KL estimate (b, r), both zero off the actions.
    """
    kl = kl_estimate(logprobs, ref_logprobs, estimator) * action_mask
    rewards = (-kl_coef * kl + token_scores) * action_mask
    return rewards, kl


def adaptive_kl_coef(kl_coef: float, kl: float, target: float, horizon: float, n_steps: int) -> float:
    """The next coefficient of the adaptive KL controller (Ziegler et al. 2019, section
    2.2; `AdaptiveKLController` of their lm-human-preferences, verl's `AdaptiveKLController`,
    OpenRLHF's `--kl_target`): e = clip(KL/target − 1, −0.2, 0.2),
    β ← β·(1 + e·n_steps/horizon). `kl` is the batch's mean per-sequence KL estimate,
    `n_steps` its number of samples. Plain Python floats, so a resume that reads the
    saved β back continues exactly."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * n_steps / horizon)


def last_action_scores(scores: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """A per-sequence score (b,) placed on each row's last sampled token, (b, r): where a
    completion's terminal reward is earned. A row with no sampled token gets nothing."""
    positions = torch.arange(action_mask.shape[1], device=action_mask.device).expand_as(action_mask)
    last_index = torch.where(action_mask > 0, positions, -1).max(dim=1).values  # (b,), -1 when empty
    placed = torch.zeros_like(action_mask, dtype=scores.dtype if scores.is_floating_point() else torch.float32)
    rows = torch.nonzero(last_index >= 0).squeeze(1)
    placed[rows, last_index[rows]] = scores[rows].to(placed.dtype)
    return placed


def generalized_advantage_estimate(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016, eq. 16) over the sampled tokens: A_t = Σ_l (γλ)^l δ_{t+l},
    δ_t = r_t + γ V_{t'} − V_t, where t' is the next sampled token and V = 0 after the
    last. Observation tokens are not time steps: the environment's answer is part of
    the transition from a turn's last action to the next turn's first, so the
    recursion steps over them, carrying the next action's value and the running
    advantage unchanged (verl's `compute_gae_advantage_return`, RAGEN's loss-masked
    GAE). On a single-turn row, whose actions are a prefix, this is the textbook GAE
    bit for bit (tests/pure/test_ppo_math.py).

    Args:
        rewards: (b, r) per-token rewards, zero off the actions.
        values: (b, r) critic values of the states before each token.
        action_mask: (b, r) 1.0 on sampled tokens.

    Returns:
        advantages (b, r) and returns = advantages + values (b, r), zero off the actions.
    """
    values = values * action_mask
    length = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(running)
    for t in reversed(range(length)):
        acting = action_mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        stepped = delta + gamma * lam * running
        running = torch.where(acting > 0, stepped, running)
        next_value = torch.where(acting > 0, values[:, t], next_value)
        advantages[:, t] = running * acting
    returns = (advantages + values) * action_mask
    return advantages, returns


_ENTROPY_CHUNK_ELEMENTS = 1 << 24  # 64 MiB of float32 temporaries at a time


def _row_chunks(rows: int, vocabulary: int) -> list[slice]:
    step = max(1, _ENTROPY_CHUNK_ELEMENTS // max(vocabulary, 1))
    return [slice(start, start + step) for start in range(0, rows, step)]


class _EntropyOfLogProbs(torch.autograd.Function):
    """H = −Σ_v exp(lp_v)·lp_v with dH/dlp_v = −exp(lp_v)·(lp_v + 1), computed over
    row chunks. It keeps only the log-probs for its backward, which log_softmax has
    already saved (the same storage), so the entropy term adds no full-vocabulary
    tensor to a micro-batch's graph; the naive `−(lp.exp() * lp).sum(-1)` would keep
    the probabilities as a second one (tests/pure/test_ppo_options.py measures it)."""

    @staticmethod
    def forward(ctx, log_probs: torch.Tensor) -> torch.Tensor:
        flat = log_probs.reshape(-1, log_probs.shape[-1])
        entropy = torch.empty(flat.shape[0], dtype=log_probs.dtype, device=log_probs.device)
        for rows in _row_chunks(*flat.shape):
            probs = flat[rows].exp()
            # A token of probability 0 contributes 0 (the limit of p·log p), not 0·(−inf) = NaN.
            entropy[rows] = -(probs * flat[rows].masked_fill(probs == 0, 0.0)).sum(dim=-1)
        ctx.save_for_backward(log_probs)
        return entropy.reshape(log_probs.shape[:-1])

    @staticmethod
    def backward(ctx, grad_entropy: torch.Tensor) -> torch.Tensor:
        (log_probs,) = ctx.saved_tensors
        flat = log_probs.reshape(-1, log_probs.shape[-1])
        grad_flat = grad_entropy.reshape(-1, 1)
        grad = torch.empty_like(flat)
        for rows in _row_chunks(*flat.shape):
            probs = flat[rows].exp()
            grad[rows] = torch.where(probs > 0, -grad_flat[rows] * probs * (flat[rows] + 1.0), 0.0)
        return grad.reshape(log_probs.shape)


def token_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy H = −Σ_v π(v)·log π(v) of each position's next-token distribution,
    differentiable in `log_probs` (the `rl.entropy_coef` bonus) and computed without
    keeping a second (b, r, V) tensor (`_EntropyOfLogProbs`).

    Args:
        log_probs: (b, r, V) normalised log-probs over the vocabulary (V tokens), at
            the sampling temperature; −inf on tokens the engine never samples.

    Returns:
        (b, r) entropy in nats; a uniform distribution over V tokens gives log V.
    """
    return _EntropyOfLogProbs.apply(log_probs)


@dataclass(frozen=True)
class PolicyLossOutput:
    per_token: torch.Tensor  # (b, r) the surrogate per token, with grad; the runtime aggregates it (S-PATH-2)
    loss: torch.Tensor  # the token mean over these rows' mask: a diagnostic (and the loss of one micro-batch)
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    ratio_mean: torch.Tensor
    entropy: torch.Tensor | None = None  # mean per-token entropy over the mask, when given
    # Only with the option that defines them (S-OPT-1), so default runs report what they did:
    clip_fraction_low: torch.Tensor | None = None  # A < 0 and ratio below 1 − clip_ratio: the lower clip cut it
    clip_fraction_high: torch.Tensor | None = None  # A > 0 and ratio above 1 + clip_ratio_high
    dual_clip_fraction: torch.Tensor | None = None  # A < 0 and the loss capped at −dual_clip·A
    kl_loss: torch.Tensor | None = None  # mean per-token KL(π_θ || π_ref) estimate of the loss's KL term


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float,
    entropy: torch.Tensor | None = None,
    behaviour_weights: torch.Tensor | None = None,
    *,
    clip_ratio_high: float | None = None,
    dual_clip: float | None = None,
    entropy_coef: float = 0.0,
    kl_to_reference: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> PolicyLossOutput:
    """PPO-clip surrogate (Schulman et al. 2017, eq. 7), negated for minimisation, with
    the options peers' users set (docs/reference/ppo-options.md), each off by default:

    - clip-higher (DAPO, Yu et al. 2025, eq. 10): the ratio is clipped to
      [1 − clip_ratio, 1 + clip_ratio_high];
    - dual clip (Ye et al. 2020, eq. 5): for A < 0 the per-token loss is capped at
      −dual_clip·A, so a very large ratio on a bad token cannot dominate;
    - an entropy bonus: −entropy_coef·H per token;
    - the KL in the loss (`rl.kl_in=loss`): +kl_coef·KL_est(π_θ || π_ref) per token.

    Args:
        logprobs: (b, r) log π_θ of the sampled tokens (with grad).
        old_logprobs: (b, r) log π_old, frozen at prepare_batch; one step off this is
            the proximal policy π_prox, the policy before this iteration's update.
        advantages: (b, r) frozen advantages.
        mask: (b, r) response mask.
        entropy: optional (b, r) per-token entropy of π_θ (`token_entropy`): reported
            as a diagnostic, and part of the loss only with `entropy_coef` > 0 (then
            it must carry its gradient).
        behaviour_weights: optional (b, r) π_prox/π_behav per token, frozen
            (`behaviour_weights`): the decoupled objective of a sample generated by an
            older policy (S-ASYNC-2), or π_old/π_engine, the engine-mismatch
            correction (S-OPT-1); it weighs the surrogate only. None is the
            synchronous loss exactly.
        kl_to_reference: optional (b, r) per-token KL estimate of π_θ to π_ref with
            grad (`kl_estimate(logprobs, ref_logprobs, estimator)`).

    Returns the per-token loss (b, r), which `rl.loss_aggregation` turns into the
    minibatch's loss (algorithm/loss_aggregation.py), its token mean over these rows,
    and diagnostics, each a token mean over these rows.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    upper = clip_ratio if clip_ratio_high is None else clip_ratio_high
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + upper)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        capped = torch.minimum(per_token, -dual_clip * advantages)
        per_token = torch.where(advantages < 0, capped, per_token)
    if behaviour_weights is not None:
        per_token = per_token * behaviour_weights
    if kl_to_reference is not None:
        per_token = per_token + kl_coef * kl_to_reference
    if entropy_coef:
        per_token = per_token - entropy_coef * entropy
    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        cut = clipped > unclipped
        clip_fraction = masked_mean(cut.float(), mask)
        # k3 estimator of KL(old || new) (Schulman's "Approximating KL" note): >= 0, low variance.
        approx_kl = masked_mean(ratio - 1.0 - log_ratio, mask)
        ratio_mean = masked_mean(ratio, mask)
        entropy_mean = None if entropy is None else masked_mean(entropy, mask)
        options: dict[str, torch.Tensor] = {}
        if clip_ratio_high is not None:
            options["clip_fraction_low"] = masked_mean((cut & (advantages < 0)).float(), mask)
            options["clip_fraction_high"] = masked_mean((cut & (advantages > 0)).float(), mask)
        if dual_clip is not None:
            options["dual_clip_fraction"] = masked_mean(
                ((advantages < 0) & (torch.maximum(unclipped, clipped) > -dual_clip * advantages)).float(), mask
            )
        if kl_to_reference is not None:
            options["kl_loss"] = masked_mean(kl_to_reference, mask)
    return PolicyLossOutput(per_token, loss, clip_fraction, approx_kl, ratio_mean, entropy_mean, **options)


def behaviour_weights(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled PPO's importance weight π_prox/π_behav per token (Hilton et al. 2022,
    "Batch size-invariance for policy optimization", eq. 4; AReaL's asynchronous PPO,
    Fu et al. 2025): the clipped surrogate is taken around the proximal policy, and
    weighted by how much more (or less) likely that policy finds the token than the
    one that sampled it. Truncated at `cap` (truncated importance sampling, as in
    verl's and OpenRLHF's off-policy corrections) so one unlikely token cannot dominate.

    The same truncated ratio with the trainer's π_old over the engine's π_engine of the
    same weights is the engine-mismatch correction `rl.rollout.engine_mismatch_cap`
    (TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy
    RL Training"): the engine samples with other kernels than the trainer scores.

    Args:
        proximal_logprobs: (b, r) log π_prox of the sampled tokens (no grad).
        behaviour_logprobs: (b, r) log π_behav, the generating engine's log-probs
            (the trajectory's `rollout_logprobs`).
        mask: (b, r) response mask.
        cap: the truncation, >= 1.

    Returns:
        the weights (b, r), zero on padding, and the fraction of real tokens truncated.
    """
    raw = torch.exp(proximal_logprobs - behaviour_logprobs) * mask
    weights = torch.clamp(raw, max=cap) * mask
    return weights, masked_mean((raw > cap).float(), mask)


@dataclass(frozen=True)
class ValueLossOutput:
    per_token: torch.Tensor  # (b, r) with grad; the runtime aggregates it (S-PATH-2)
    loss: torch.Tensor  # the token mean over these rows' mask (a diagnostic)
    clip_fraction: torch.Tensor


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float,
) -> ValueLossOutput:
    """Clipped value loss of OpenAI baselines' ppo2: ½·max((V−R)², (V_clip−R)²),
    V_clip = V_old + clamp(V − V_old, −c, c).

    Args:
        values: (b, r) current critic predictions (with grad).
        old_values: (b, r) predictions frozen at prepare_batch.
        returns: (b, r) GAE returns.
        mask: (b, r) response mask.

    Returns the per-token loss (b, r), its token mean over these rows, and the
    fraction of tokens whose clipped error was the larger.
    """
    clipped_values = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    # Halving is exact in floating point, so the token mean of this is 0.5 · the mean, bit for bit.
    per_token = 0.5 * torch.maximum(unclipped_error, clipped_error)
    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_error > unclipped_error).float(), mask)
    return ValueLossOutput(per_token, loss, clip_fraction)


def explained_variance(predictions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V)/Var(R) over real tokens: 1 is perfect, 0 is no better than a
    constant, negative is worse (CleanRL logs the same quantity)."""
    target_var = masked_var(targets, mask)
    if target_var.item() == 0.0:
        return float("nan")
    return float(1.0 - masked_var(targets - predictions, mask) / target_var)
