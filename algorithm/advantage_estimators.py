"""Advantage estimators as a registry (S-OPT-2): one entry per name of
`rl.advantage_estimator`, each a function over the one-path contract's per-token
rewards and action mask (S-PATH-1), so an estimator is one entry, as a reward rule is.

Every estimator receives the KL-penalised per-token rewards (`kl_penalised_rewards`:
with `rl.kl_in=loss` they are the scores alone) and returns per-token advantages and
the returns the critic regresses on (critic-free estimators return the advantages
again; nothing reads them). Formulas, sources and costs: docs/reference/ppo-options.md.

An entry's traits (needs a critic, needs groups, whitens) are in
configs/estimator_traits.py, below this room, where the config and the placement plan
read them; this module pairs each with its formula and refuses to import when the two
lists differ. The pre-flight imports no torch, so the formulas import it when they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from configs.estimator_traits import ESTIMATOR_TRAITS, EstimatorTraits, estimator_traits

if TYPE_CHECKING:
    import torch

GROUP_STD_EPS = 1e-6  # verl's `epsilon` of the GRPO advantage


@dataclass(frozen=True)
class EstimatorInputs:
    """What any estimator may read; each reads what its formula needs.

    rewards: (b, r) per-token rewards, zero off the actions.
    values: (b, r) the critic's values, or None for a critic-free estimator.
    action_mask: (b, r) 1.0 on sampled tokens.
    group_ids: (b,) the prompt each row sampled: rows of one group compare to each other.
    """

    rewards: torch.Tensor
    values: torch.Tensor | None
    action_mask: torch.Tensor
    group_ids: torch.Tensor
    gamma: float
    lam: float
    grpo_scale: bool


@dataclass(frozen=True)
class AdvantageEstimator(EstimatorTraits):
    """An entry's traits (configs/estimator_traits.py) and its formula."""

    compute: Callable[[EstimatorInputs], tuple[torch.Tensor, torch.Tensor]]


def _gae(inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor]:
    from algorithm.ppo_math import generalized_advantage_estimate

    assert inputs.values is not None, "gae needs the critic's values"
    return generalized_advantage_estimate(inputs.rewards, inputs.values, inputs.action_mask, inputs.gamma, inputs.lam)


def _sequence_scores(inputs: EstimatorInputs) -> torch.Tensor:
    """Each row's outcome: the sum of its per-token rewards, (b,)."""
    return (inputs.rewards * inputs.action_mask).sum(dim=1)


def _group_members(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inverse, counts): each row's group as 0..g-1, and each group's size."""
    import torch

    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return inverse, counts


def _on_actions(scores: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = scores.unsqueeze(1).to(action_mask.dtype) * action_mask
    return advantages, advantages


def _grpo(inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantage (Shao et al. 2024, DeepSeekMath, section 4.1.2, outcome
    supervision): (R_i − mean_group R) / (std_group R + ε), std Bessel-corrected, on every
    sampled token of row i; with `rl.grpo_scale` false the division is dropped (Liu et al.
    2025, Dr. GRPO). A group of one compares to nothing: its mean is 0, its std 1 (verl)."""
    import torch

    scores = _sequence_scores(inputs)
    inverse, counts = _group_members(inputs.group_ids)
    groups = counts.shape[0]
    sums = torch.zeros(groups, dtype=scores.dtype).index_add_(0, inverse, scores)
    means = torch.where(counts > 1, sums / counts, torch.zeros_like(sums))
    centred = scores - means[inverse]
    if not inputs.grpo_scale:
        return _on_actions(centred, inputs.action_mask)
    squares = torch.zeros(groups, dtype=scores.dtype).index_add_(0, inverse, (scores - (sums / counts)[inverse]) ** 2)
    stds = torch.where(counts > 1, torch.sqrt(squares / (counts - 1).clamp(min=1)), torch.ones_like(sums))
    return _on_actions(centred / (stds[inverse] + GROUP_STD_EPS), inputs.action_mask)


def _rloo(inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024): R_i minus the
    mean of the other samples of its group, R_i − (Σ_group R − R_i)/(n − 1), on every
    sampled token of row i. A group of one has no other sample: refused."""
    import torch

    scores = _sequence_scores(inputs)
    inverse, counts = _group_members(inputs.group_ids)
    if bool((counts < 2).any()):
        raise ValueError("rloo compares each sample with the others of its prompt: every group needs two or more")
    sums = torch.zeros(counts.shape[0], dtype=scores.dtype).index_add_(0, inverse, scores)
    others = (sums[inverse] - scores) / (counts[inverse] - 1)
    return _on_actions(scores - others, inputs.action_mask)


def _reinforce_plus_plus(inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): the discounted return of each sampled
    token, G_t = r_t + γ G_{t'} over the row's later sampled tokens t' (observation tokens
    are skipped, as in the masked GAE; on a single-turn row this is verl's recursion),
    whitened over the batch's sampled tokens (the entry's `whitens`, so
    rl.whiten_advantages=false leaves plain REINFORCE with the KL). The per-token KL
    penalty is in r_t when rl.kl_in=reward."""
    import torch

    rewards, mask = inputs.rewards, inputs.action_mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        acting = mask[:, t]
        running = torch.where(acting > 0, rewards[:, t] + inputs.gamma * running, running)
        returns[:, t] = running * acting
    return returns, returns


_FORMULAS: dict[str, Callable[[EstimatorInputs], tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": _gae,
    "grpo": _grpo,
    "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_plus_plus,
}
if list(_FORMULAS) != list(ESTIMATOR_TRAITS):
    raise RuntimeError(
        f"the estimators with a formula ({', '.join(_FORMULAS)}) are not those configs/estimator_traits.py lists "
        f"({', '.join(ESTIMATOR_TRAITS)})"
    )
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    name: AdvantageEstimator(**vars(traits), compute=_FORMULAS[name]) for name, traits in ESTIMATOR_TRAITS.items()
}


def advantage_estimator(name: str) -> AdvantageEstimator:
    """The entry `name`; an unknown name is refused listing the known ones."""
    return ADVANTAGE_ESTIMATORS[estimator_traits(name).name]
