"""The PPO options peers' users set (S-OPT-1), against numbers worked by hand in float64
(the arithmetic is in the comments) and against the definition each one cites, written
out here independently: the papers state an objective to maximise, the code a loss."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from algorithm.ppo_math import (
    KL_ESTIMATORS,
    adaptive_kl_coef,
    behaviour_weights,
    clipped_policy_loss,
    kl_estimate,
    kl_penalised_rewards,
    masked_mean,
    token_entropy,
)
from configs.loading import ConfigError, load_config
from configs.schema import RLConfig
from tests.conftest import TINY_PROFILE

F64 = torch.float64


def _tokens(*values: float) -> torch.Tensor:
    return torch.tensor([values], dtype=F64)


# --- clip-higher and the dual clip -------------------------------------------------


def test_clip_higher_by_hand():
    ratios = _tokens(1.25, 1.5, 0.5, 1.0)
    advantages = _tokens(1.0, 1.0, -1.0, -1.0)
    old = torch.zeros(1, 4, dtype=F64)
    mask = torch.ones(1, 4, dtype=F64)
    symmetric = clipped_policy_loss(ratios.log(), old, advantages, mask, clip_ratio=0.2)
    # symmetric: token 0 is clipped at 1.2: max(−1.25, −1.2) = −1.2
    assert symmetric.per_token[0, 0].item() == pytest.approx(-1.2, abs=1e-12)
    assert symmetric.clip_fraction_low is None and symmetric.clip_fraction_high is None  # only with the option
    out = clipped_policy_loss(ratios.log(), old, advantages, mask, clip_ratio=0.2, clip_ratio_high=0.28)
    # token 0: 1.25 < 1.28, unclipped: −1.25     token 1: clamp(1.5) = 1.28: max(−1.5, −1.28) = −1.28
    # token 2 (A=−1): clamp(0.5) = 0.8: max(0.5, 0.8) = 0.8 (lower clip)   token 3: ratio 1: 1.0
    torch.testing.assert_close(out.per_token, _tokens(-1.25, -1.28, 0.8, 1.0), rtol=0, atol=1e-12)
    # clipped: tokens 1 (upper) and 2 (lower) of 4
    assert (out.clip_fraction.item(), out.clip_fraction_low.item(), out.clip_fraction_high.item()) == (
        0.5, 0.25, 0.25
    )


def test_dual_clip_by_hand_caps_only_negative_advantages():
    ratios = _tokens(5.0, 2.0, 5.0, 0.5)
    advantages = _tokens(-1.0, -1.0, 1.0, -2.0)
    old = torch.zeros(1, 4, dtype=F64)
    logprobs = ratios.log().requires_grad_()
    out = clipped_policy_loss(logprobs, old, advantages, torch.ones(1, 4, dtype=F64), clip_ratio=0.2, dual_clip=3.0)
    # token 0 (A=−1): max(5, 1.2) = 5, capped at −3·A = 3          token 1: max(2, 1.2) = 2 < 3: 2
    # token 2 (A=+1): max(−5, −1.2) = −1.2, no cap for A > 0       token 3 (A=−2): max(1, 1.6) = 1.6 < 6: 1.6
    torch.testing.assert_close(out.per_token, _tokens(3.0, 2.0, -1.2, 1.6), rtol=0, atol=1e-12)
    assert out.dual_clip_fraction.item() == 0.25  # token 0 only
    out.per_token.sum().backward()
    # the capped token (a constant −c·A) and the clipped ones carry no gradient; token 1: d(−A·e^θ)/dθ = 2
    torch.testing.assert_close(logprobs.grad, _tokens(0.0, 2.0, 0.0, 0.0), rtol=0, atol=1e-12)


def _dapo_dual_clip_loss(ratio, advantages, low, high, dual):
    """DAPO (Yu et al. 2025, eq. 10) maximises min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A);
    dual-clip PPO (Ye et al. 2020, eq. 5) maximises max(that, c·A) where A < 0. Loss = −objective."""
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - low, 1 + high) * advantages)
    if dual is not None:
        objective = torch.where(advantages < 0, torch.maximum(objective, dual * advantages), objective)
    return -objective


@pytest.mark.parametrize("high, dual", [(None, None), (0.28, None), (None, 3.0), (0.28, 1.5)])
def test_clip_variants_match_the_papers_objectives(high, dual):
    generator = torch.Generator().manual_seed(0)
    log_ratio = 1.5 * torch.randn(4, 64, generator=generator, dtype=F64)
    advantages = torch.randn(4, 64, generator=generator, dtype=F64)
    mask = torch.ones(4, 64, dtype=F64)
    out = clipped_policy_loss(log_ratio, torch.zeros_like(log_ratio), advantages, mask, 0.2,
                              clip_ratio_high=high, dual_clip=dual)
    want = _dapo_dual_clip_loss(log_ratio.exp(), advantages, 0.2, 0.2 if high is None else high, dual)
    torch.testing.assert_close(out.per_token, want, rtol=1e-12, atol=1e-12)


# --- KL estimators, the KL in the loss, the adaptive coefficient ----------------------


def test_kl_estimators_by_hand():
    logprobs, ref = _tokens(-1.0, -1.5, -1.0), _tokens(-1.5, -1.0, -1.0)  # d = log π − log π_ref = [0.5, −0.5, 0]
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k1"), _tokens(0.5, -0.5, 0.0))
    # k2 = d²/2 = [0.125, 0.125, 0]
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k2"), _tokens(0.125, 0.125, 0.0))
    # k3 = e^−d − 1 + d: e^−0.5 − 0.5 = 0.1065306597, e^0.5 − 1.5 = 0.1487212707, 0
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k3"), _tokens(0.1065306597, 0.1487212707, 0.0))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; known: k1, k2, k3"):
        kl_estimate(logprobs, ref, "k4")


def test_kl_estimators_match_schulmans_note_and_the_peers():
    """Schulman's note: k1 and k3 are unbiased, E_π[k] = KL(π ‖ π_ref) exactly (k3 because
    E_π[π_ref/π] = 1), k2 and k3 are never negative. Exact expectations over V = 6 tokens."""
    generator = torch.Generator().manual_seed(1)
    log_pi = torch.randn(6, generator=generator, dtype=F64).log_softmax(-1)
    log_ref = torch.randn(6, generator=generator, dtype=F64).log_softmax(-1)
    pi = log_pi.exp()
    true_kl = (pi * (log_pi - log_ref)).sum()
    for name in ("k1", "k3"):
        expected = (pi * kl_estimate(log_pi, log_ref, name)).sum()
        torch.testing.assert_close(expected, true_kl, rtol=1e-12, atol=1e-12)
    assert (kl_estimate(log_pi, log_ref, "k2") >= 0).all() and (kl_estimate(log_pi, log_ref, "k3") >= 0).all()
    # The peers' spellings: OpenRLHF's `k2` squares log π − log π_ref and halves it; verl's
    # `low_var_kl` writes k3 from kl = log π_ref − log π as exp(kl) − kl − 1 (then clamps it to
    # [−10, 10]; ours is not clamped, docs/reference/ppo-options.md).
    torch.testing.assert_close(kl_estimate(log_pi, log_ref, "k2"), (log_pi - log_ref) ** 2 / 2)
    kl = log_ref - log_pi
    torch.testing.assert_close(kl_estimate(log_pi, log_ref, "k3"), kl.exp() - kl - 1, rtol=1e-12, atol=1e-12)


def test_the_schema_offers_exactly_the_registered_estimators():
    assert list(typing.get_args(RLConfig.model_fields["kl_estimator"].annotation)) == list(KL_ESTIMATORS)


def test_k3_penalty_in_the_reward_by_hand():
    logprobs, ref = _tokens(-1.0, -1.5, -1.0), _tokens(-1.5, -1.0, -1.0)
    scores = _tokens(0.0, 0.0, 1.0)
    mask = torch.ones(1, 3, dtype=F64)
    rewards, kl = kl_penalised_rewards(scores, logprobs, ref, mask, kl_coef=0.1, estimator="k3")
    # −0.1·k3 = [−0.01065306597, −0.01487212707, 0], the score on the last token
    torch.testing.assert_close(rewards, _tokens(-0.01065306597, -0.01487212707, 1.0))
    # k1, the default, is log π_old − log π_ref exactly, as before the option existed
    _, k1 = kl_penalised_rewards(scores, logprobs, ref, mask, kl_coef=0.1)
    assert torch.equal(k1, (logprobs - ref) * mask)


def test_kl_in_the_loss_and_the_entropy_bonus_are_per_token_terms_by_hand():
    old = torch.zeros(1, 2, dtype=F64)
    logprobs = torch.zeros(1, 2, dtype=F64, requires_grad=True)  # ratio 1: surrogate −A
    advantages = _tokens(1.0, -2.0)
    mask = _tokens(1.0, 0.0)  # the second token is padding
    ref = _tokens(-0.5, 0.0)
    kl = kl_estimate(logprobs, ref, "k3")  # d = 0.5: e^−0.5 − 0.5 = 0.1065306597
    entropy = _tokens(2.0, 9.0).requires_grad_()
    out = clipped_policy_loss(logprobs, old, advantages, mask, 0.2, entropy,
                              kl_to_reference=kl, kl_coef=0.1, entropy_coef=0.01)
    # token 0: −1 + 0.1·0.1065306597 − 0.01·2 = −1.0093469340
    assert out.per_token[0, 0].item() == pytest.approx(-1.0093469340, abs=1e-10)
    assert out.loss.item() == pytest.approx(-1.0093469340, abs=1e-10)  # padding is masked out
    assert out.kl_loss.item() == pytest.approx(0.1065306597, abs=1e-10)
    out.loss.backward()
    # d/dθ: −A·e^θ = −1, plus 0.1·dk3/dθ = 0.1·(1 − e^−d) = 0.1·0.3934693403; the bonus: −0.01 per nat
    assert logprobs.grad[0, 0].item() == pytest.approx(-1 + 0.1 * (1 - math.exp(-0.5)), abs=1e-12)
    assert entropy.grad[0].tolist() == pytest.approx([-0.01, 0.0])


def test_adaptive_kl_coefficient_by_hand():
    # Ziegler et al. 2019: e = clip(KL/target − 1, −0.2, 0.2), β·(1 + e·n/horizon); n = 64, horizon 10000
    # KL 0.15, target 0.1: e = 0.5 clipped to 0.2: 0.1·(1 + 0.2·64/10000) = 0.100128
    assert adaptive_kl_coef(0.1, 0.15, 0.1, 10000, 64) == pytest.approx(0.100128, abs=1e-15)
    # KL 0.09: e = −0.1: 0.1·(1 − 0.1·64/10000) = 0.099936
    assert adaptive_kl_coef(0.1, 0.09, 0.1, 10000, 64) == pytest.approx(0.099936, abs=1e-15)
    # KL 0: e = −1 clipped to −0.2: 0.1·(1 − 0.00128) = 0.099872; on target it stays put
    assert adaptive_kl_coef(0.1, 0.0, 0.1, 10000, 64) == pytest.approx(0.099872, abs=1e-15)
    assert adaptive_kl_coef(0.1, 0.1, 0.1, 10000, 64) == 0.1


# --- the entropy bonus ---------------------------------------------------------------


def test_entropy_gradient_is_the_naive_formulas():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 7, generator=generator, dtype=F64)
    logits[0, 1, 4] = -math.inf  # a token the engine never samples
    weights = torch.randn(2, 3, generator=generator, dtype=F64)
    ours_logits = logits.clone().requires_grad_()
    (token_entropy(ours_logits.log_softmax(-1)) * weights).sum().backward()
    naive_logits = logits.clone().requires_grad_()
    probs = naive_logits.softmax(-1)
    (-(probs * naive_logits.log_softmax(-1).masked_fill(probs == 0, 0.0)).sum(-1) * weights).sum().backward()
    assert not ours_logits.grad.isnan().any()
    torch.testing.assert_close(ours_logits.grad, naive_logits.grad, rtol=1e-12, atol=1e-12)
    log_probs = torch.randn(2, 3, 5, generator=generator, dtype=F64).log_softmax(-1).requires_grad_()
    assert torch.autograd.gradcheck(token_entropy, (log_probs,))


def _saved_bytes(compute) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of `compute()`."""
    storages: dict[int, int] = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        compute()
    return sum(storages.values())


def test_the_entropy_term_keeps_no_second_vocabulary_tensor():
    """log_softmax keeps its (b, r, V) output for the backward; the entropy keeps that
    same storage and nothing else of vocabulary size. The naive −Σ exp(lp)·lp keeps
    the probabilities and the masked log-probs as well: two more (b, r, V) tensors."""
    logits = torch.randn(4, 16, 512, dtype=torch.float32, requires_grad=True)
    one = logits.numel() * 4

    def ours():
        return token_entropy(logits.log_softmax(-1))

    def naive():
        log_probs = logits.log_softmax(-1)
        probs = log_probs.exp()
        return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)

    assert _saved_bytes(ours) == one
    assert _saved_bytes(naive) >= 3 * one


# --- the engine-mismatch correction ---------------------------------------------------


def test_engine_mismatch_weight_by_hand():
    trainer = _tokens(0.5, 0.3, 0.2, 0.9).log()  # π_old, recomputed by the trainer
    engine = _tokens(0.25, 0.6, 0.05, 0.1).log()  # π_engine, what the engine sampled with
    mask = _tokens(1.0, 1.0, 1.0, 0.0)  # the last token is padding
    weights, truncated = behaviour_weights(trainer, engine, mask, cap=3.0)
    # π_old/π_engine = 0.5/0.25 = 2, 0.3/0.6 = 0.5, 0.2/0.05 = 4 → truncated to 3; padding 0
    torch.testing.assert_close(weights, _tokens(2.0, 0.5, 3.0, 0.0), rtol=0, atol=1e-12)
    assert truncated.item() == pytest.approx(1 / 3, abs=1e-12)  # one of the three real tokens
    assert masked_mean(weights, mask).item() == pytest.approx(5.5 / 3, abs=1e-12)  # (2 + 0.5 + 3)/3

    # π_θ = [0.75, 0.3, 0.1, 0.9]: r = π_θ/π_old = [1.5, 1, 0.5, 1]
    logprobs = _tokens(0.75, 0.3, 0.1, 0.9).log().requires_grad_()
    advantages = _tokens(1.0, -2.0, 1.0, 7.0)
    out = clipped_policy_loss(logprobs, trainer, advantages, mask, 0.2, behaviour_weights=weights)
    # token 0: max(−1.5, −1.2) = −1.2, ·2 = −2.4    token 1: 2·1 = 2, ·0.5 = 1
    # token 2: max(−0.5, −0.8) = −0.5, ·3 = −1.5    token 3 (padding): ·0 = 0
    torch.testing.assert_close(out.per_token, _tokens(-2.4, 1.0, -1.5, 0.0), rtol=0, atol=1e-12)
    assert out.loss.item() == pytest.approx(-2.9 / 3, abs=1e-12)  # (−2.4 + 1 − 1.5)/3
    out.per_token.sum().backward()
    # the weight is a constant factor: token 0 is clipped (no gradient); token 1: −A·w·r = 2·0.5 = 1;
    # token 2: −A·w·r = −1·3·0.5 = −1.5; padding 0
    torch.testing.assert_close(logprobs.grad, _tokens(0.0, 1.0, -1.5, 0.0), rtol=0, atol=1e-12)


def _tis_ppo_loss(ratio, advantages, trainer_probs, engine_probs, cap, eps):
    """Yao et al. 2025 ("Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training", the TIS-corrected PPO objective) maximise, per token,
    min(π_old/π_engine, C)·min(r·A, clip(r, 1 − ε, 1 + ε)·A). Loss = −objective."""
    truncated = torch.clamp(trainer_probs / engine_probs, max=cap)
    return -truncated * torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - eps, 1 + eps) * advantages)


def test_engine_mismatch_correction_matches_yao_et_al():
    generator = torch.Generator().manual_seed(2)
    trainer = torch.randn(4, 64, generator=generator, dtype=F64).clamp(max=0) - 0.1  # log π_old
    engine = trainer + 0.7 * torch.randn(4, 64, generator=generator, dtype=F64)  # a large engine gap
    logprobs = trainer + 0.5 * torch.randn(4, 64, generator=generator, dtype=F64)
    advantages = torch.randn(4, 64, generator=generator, dtype=F64)
    mask = torch.ones(4, 64, dtype=F64)
    weights, truncated = behaviour_weights(trainer, engine, mask, cap=2.0)
    assert 0 < truncated.item() < 1  # the cap bites on some tokens, not all
    out = clipped_policy_loss(logprobs, trainer, advantages, mask, 0.2, behaviour_weights=weights)
    want = _tis_ppo_loss((logprobs - trainer).exp(), advantages, trainer.exp(), engine.exp(), 2.0, 0.2)
    torch.testing.assert_close(out.per_token, want, rtol=1e-12, atol=1e-12)
    # Where engine and trainer agree the weight is exactly 1 and the loss is the plain one, bit for bit.
    ones, none_truncated = behaviour_weights(trainer, trainer, mask, cap=2.0)
    weighted = clipped_policy_loss(logprobs, trainer, advantages, mask, 0.2, behaviour_weights=ones)
    plain = clipped_policy_loss(logprobs, trainer, advantages, mask, 0.2)
    assert torch.equal(weighted.per_token, plain.per_token) and none_truncated.item() == 0.0


# --- refused at pre-flight -----------------------------------------------------------


@pytest.mark.parametrize("overrides, named", [
    (["rl.dual_clip=1"], ["rl.dual_clip is 1", "above 1"]),
    (["rl.clip_ratio=0.2", "rl.clip_ratio_high=0.1"], ["rl.clip_ratio_high (0.1)", "rl.clip_ratio (0.2)"]),
    (["rl.kl_estimator=k4"], ["rl.kl_estimator", "'k1'", "'k2'", "'k3'"]),
    (["rl.kl_target=0.1"], ["rl.kl_target is 0.1", "rl.kl_horizon"]),
    (["rl.kl_in=penalty"], ["rl.kl_in", "'reward'", "'loss'"]),
    (["rl.rollout.engine_mismatch_cap=0.5"], ["rl.rollout.engine_mismatch_cap", "greater than or equal to 1"]),
    (["rl.rollout.engine_mismatch_cap=2", "rl.rollout.max_staleness=1"],
     ["rl.rollout.engine_mismatch_cap (2)", "rl.rollout.max_staleness=1", "rl.rollout.behaviour_weight_cap"]),
])
def test_contradictions_are_refused_naming_the_keys(overrides, named):
    assert_refused_naming(overrides, named)


def assert_refused_naming(overrides: list[str], named: list[str]) -> None:
    """The tiny profile with `overrides` is refused, every part of `named` in the problems."""
    with pytest.raises(ConfigError) as caught:
        load_config(TINY_PROFILE, overrides)
    message = "\n".join(caught.value.problems)
    assert all(part in message for part in named), message


def test_the_options_together_are_accepted_and_off_by_default():
    rl = load_config(TINY_PROFILE, []).rl
    assert (rl.clip_ratio_high, rl.dual_clip, rl.kl_estimator, rl.kl_in, rl.kl_target, rl.entropy_coef,
            rl.rollout.engine_mismatch_cap) == (None, None, "k1", "reward", None, 0.0, None)
    load_config(TINY_PROFILE, ["rl.clip_ratio_high=0.28", "rl.dual_clip=3", "rl.kl_estimator=k3", "rl.kl_in=loss",
                               "rl.kl_target=0.05", "rl.kl_horizon=10000", "rl.entropy_coef=0.001",
                               "rl.rollout.engine_mismatch_cap=2"])
