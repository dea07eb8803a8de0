"""PPO's tensor math as small pure functions.

Notation used in every shape below:
    b = number of sequences in the batch, r = response length (padded).
All per-token tensors are right-padded over the response; `mask` is 1.0 on real
response tokens (up to and including EOS) and 0.0 on padding.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def kl_penalised_rewards(
    token_scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: −kl_coef·(log π_old − log π_ref) on every sampled token, plus
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
        kl_coef: β of the penalty.

    Returns:
        rewards (b, r) and the per-token KL estimate (b, r), both zero off the actions.
    """
    kl = (logprobs - ref_logprobs) * action_mask
    rewards = (-kl_coef * kl + token_scores) * action_mask
    return rewards, kl


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


def token_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy H = −Σ_v π(v)·log π(v) of each position's next-token distribution.

    Args:
        log_probs: (b, r, V) normalised log-probs over the vocabulary (V tokens), at
            the sampling temperature; −inf on tokens the engine never samples.

    Returns:
        (b, r) entropy in nats; a uniform distribution over V tokens gives log V.
    """
    probs = log_probs.exp()
    # A token of probability 0 contributes 0 (the limit of p·log p), not 0·(−inf) = NaN.
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(dim=-1)


@dataclass(frozen=True)
class PolicyLossOutput:
    per_token: torch.Tensor  # (b, r) the surrogate per token, with grad; the runtime aggregates it (S-PATH-2)
    loss: torch.Tensor  # the token mean over these rows' mask: a diagnostic (and the loss of one micro-batch)
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    ratio_mean: torch.Tensor
    entropy: torch.Tensor | None = None  # mean per-token entropy over the mask, when given


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float,
    entropy: torch.Tensor | None = None,
    behaviour_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """PPO-clip surrogate (Schulman et al. 2017, eq. 7), negated for minimisation.

    Args:
        logprobs: (b, r) log π_θ of the sampled tokens (with grad).
        old_logprobs: (b, r) log π_old, frozen at prepare_batch; one step off this is
            the proximal policy π_prox, the policy before this iteration's update.
        advantages: (b, r) frozen advantages.
        mask: (b, r) response mask.
        entropy: optional (b, r) per-token entropy of π_θ (`token_entropy`, no grad):
            reported as a diagnostic only, never part of the loss.
        behaviour_weights: optional (b, r) π_prox/π_behav per token, frozen
            (`behaviour_weights`): the decoupled objective of a sample generated by an
            older policy (S-ASYNC-2). None is the synchronous loss exactly.

    Returns the per-token loss (b, r), which `rl.loss_aggregation` turns into the
    minibatch's loss (algorithm/loss_aggregation.py), its token mean over these rows,
    and diagnostics, each a token mean over these rows.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    per_token = torch.maximum(unclipped, clipped)
    if behaviour_weights is not None:
        per_token = per_token * behaviour_weights
    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)
        # k3 estimator of KL(old || new) (Schulman's "Approximating KL" note): >= 0, low variance.
        approx_kl = masked_mean(ratio - 1.0 - log_ratio, mask)
        ratio_mean = masked_mean(ratio, mask)
        entropy_mean = None if entropy is None else masked_mean(entropy, mask)
    return PolicyLossOutput(per_token, loss, clip_fraction, approx_kl, ratio_mean, entropy_mean)


def behaviour_weights(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled PPO's importance weight π_prox/π_behav per token (Hilton et al. 2022,
    "Batch size-invariance for policy optimization", eq. 4; AReaL's asynchronous PPO,
    Fu et al. 2025): the clipped surrogate is taken around the proximal policy, and
    weighted by how much more (or less) likely that policy finds the token than the
    one that sampled it. Truncated at `cap` (truncated importance sampling, as in
    verl's and OpenRLHF's off-policy corrections) so one unlikely token cannot dominate.

    Args:
        proximal_logprobs: (b, r) log π_prox of the sampled tokens (no grad).
        behaviour_logprobs: (b, r) log π_behav, the generating engine's log-probs.
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
