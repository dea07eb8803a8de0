"""PPO math against numbers worked by hand (torchtune style: the arithmetic is in
the comments, so a reader can check the expectation without running anything)."""

import math

import pytest
import torch

from algorithm.ppo_math import (
    behaviour_weights,
    clipped_policy_loss,
    clipped_value_loss,
    generalized_advantage_estimate,
    kl_penalised_rewards,
    last_action_scores,
    token_entropy,
    whiten,
)


def test_gae_with_discount_and_lambda():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 0.6]])
    mask = torch.ones(1, 3)
    advantages, returns = generalized_advantage_estimate(rewards, values, mask, gamma=0.9, lam=0.5)
    # δ2 = 1 + 0.9·0 − 0.6 = 0.4                A2 = 0.4
    # δ1 = 0 + 0.9·0.6 − 0.4 = 0.14             A1 = 0.14 + 0.45·0.4 = 0.32
    # δ0 = 0 + 0.9·0.4 − 0.2 = 0.16             A0 = 0.16 + 0.45·0.32 = 0.304
    torch.testing.assert_close(advantages, torch.tensor([[0.304, 0.32, 0.4]]))
    # returns = A + V = [0.504, 0.72, 1.0]
    torch.testing.assert_close(returns, torch.tensor([[0.504, 0.72, 1.0]]))


def test_gae_ignores_values_and_rewards_on_padding():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 9.0]])  # 9.0 sits on padding and must not leak in
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    advantages, returns = generalized_advantage_estimate(rewards, values, mask, gamma=1.0, lam=1.0)
    # δ1 = 1 + 0 − 0.5 = 0.5 -> A1 = 0.5; δ0 = 0 + 0.5 − 0.5 = 0 -> A0 = 0 + 0.5 = 0.5
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.5, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 0.0]]))


def test_kl_penalty_and_terminal_score_land_on_the_right_tokens():
    scores = torch.tensor([1.0, 2.0])
    logprobs = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref_logprobs = torch.tensor([[-1.5, -1.0, -0.5], [-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    token_scores = last_action_scores(scores, mask)
    # the score on each row's last sampled token: [[0, 0, 1], [0, 2, 0]]
    torch.testing.assert_close(token_scores, torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]))
    rewards, kl = kl_penalised_rewards(token_scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
    # kl = [0.5, 0, −0.5]; −0.1·kl = [−0.05, 0, 0.05]; score on the last real token
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 1.05], [-0.05, 2.0, 0.0]]))
    torch.testing.assert_close(kl, torch.tensor([[0.5, 0.0, -0.5], [0.5, 0.0, 0.0]]))


def test_a_terminal_score_lands_on_the_last_sampled_token_not_after_an_observation():
    # actions, an observation, actions, then a trailing observation and padding
    actions = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    placed = last_action_scores(torch.tensor([3.0, 5.0]), actions)
    # row 0's last action is token 3; row 1 sampled nothing, so it earns nothing
    torch.testing.assert_close(placed, torch.tensor([[0.0, 0.0, 0.0, 3.0, 0.0, 0.0], [0.0] * 6]))


def test_clipped_policy_loss_by_hand():
    old = torch.tensor([[-2.0, -2.0]])
    new = old + 1.0  # ratio = e ≈ 2.71828 on both tokens
    advantages = torch.tensor([[1.0, -1.0]])
    out = clipped_policy_loss(new, old, advantages, torch.ones(1, 2), clip_ratio=0.2)
    # token 0 (A=+1): max(−e, −1.2) = −1.2 (clipped)   token 1 (A=−1): max(e, 1.2) = e
    # loss = (−1.2 + e) / 2 = 0.75914
    assert out.loss.item() == pytest.approx((math.e - 1.2) / 2, abs=1e-5)
    assert out.clip_fraction.item() == pytest.approx(0.5)
    # k3: ratio − 1 − log ratio = e − 2
    assert out.approx_kl.item() == pytest.approx(math.e - 2, abs=1e-5)


def test_decoupled_loss_without_lag_is_the_ppo_loss_and_weighs_a_lagged_token_by_hand():
    """S-ASYNC-2: with no lag the weights are 1 and the loss is S-FLOW's bit for bit; one
    step off each token's surrogate is weighed by pi_prox/pi_behav, truncated at the cap."""
    prox = torch.tensor([[-2.0, -2.0, -1.0]])
    new = prox + torch.tensor([[1.0, 0.0, 0.1]])
    advantages = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    synchronous = clipped_policy_loss(new, prox, advantages, mask, clip_ratio=0.2)
    unlagged, truncated = behaviour_weights(prox, prox, mask, cap=2.0)
    assert torch.equal(unlagged, mask) and truncated.item() == 0.0
    weighted = clipped_policy_loss(new, prox, advantages, mask, 0.2, behaviour_weights=unlagged)
    assert torch.equal(weighted.loss, synchronous.loss)

    # The behaviour policy found token 0 e^-0.5 as likely as the proximal one (weight
    # e^0.5 = 1.6487) and token 1 e^1 as likely (weight e^-1 = 0.3679); a third sample's
    # weight e^3 would be 20.1, truncated to the cap of 2.
    behaviour = prox - torch.tensor([[0.5, -1.0, 3.0]])
    weights, truncated = behaviour_weights(prox, behaviour, torch.ones(1, 3), cap=2.0)
    assert weights[0].tolist() == pytest.approx([math.exp(0.5), math.exp(-1.0), 2.0], abs=1e-6)
    assert truncated.item() == pytest.approx(1 / 3)
    lagged = clipped_policy_loss(new, prox, advantages, mask, 0.2, behaviour_weights=weights * mask)
    # token 0: max(-e, -1.2) = -1.2, times 1.6487; token 1: max(1, 1) = 1, times 0.3679
    assert lagged.loss.item() == pytest.approx((-1.2 * math.exp(0.5) + math.exp(-1.0)) / 2, abs=1e-5)


def test_token_entropy_by_hand():
    log_probs = torch.stack([
        torch.full((4,), -math.log(4)),  # uniform over V = 4: H = log 4
        torch.tensor([0.0, -math.inf, -math.inf, -math.inf]),  # certain: H = 0, not NaN
        torch.tensor([-math.log(2), -math.log(2), -math.inf, -math.inf]),  # two excluded tokens: H = log 2
    ]).unsqueeze(0)  # (b=1, r=3, V=4)
    torch.testing.assert_close(token_entropy(log_probs), torch.tensor([[math.log(4), 0.0, math.log(2)]]))


def test_policy_loss_reports_entropy_beside_an_unchanged_loss():
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.1, -0.2, 0.3]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    entropy = torch.tensor([[1.0, 2.0, 9.0]])  # 9.0 sits on padding
    with_entropy = clipped_policy_loss(new, old, torch.ones(1, 3), mask, clip_ratio=0.2, entropy=entropy)
    without = clipped_policy_loss(new, old, torch.ones(1, 3), mask, clip_ratio=0.2)
    assert with_entropy.entropy.item() == pytest.approx(1.5)  # (1 + 2) / 2
    assert without.entropy is None
    assert torch.equal(with_entropy.loss, without.loss)


def test_policy_loss_gradient_flows_only_through_unclipped_tokens():
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.5, 0.05]], requires_grad=True)  # ratios e^0.5 ≈ 1.65 (clipped), e^0.05 ≈ 1.05
    out = clipped_policy_loss(new, old, torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), clip_ratio=0.2)
    out.loss.backward()
    # clipped token has zero gradient; the other: d/dθ(−e^θ)/2 = −e^0.05/2 ≈ −0.5256
    assert new.grad[0, 0].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-math.exp(0.05) / 2, abs=1e-5)


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0]])
    old_values = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[1.0, 1.0]])
    out = clipped_value_loss(values, old_values, returns, torch.ones(1, 2), value_clip=0.2)
    # token 0: V_clip = 0.7; max((1−1)², (0.7−1)²) = 0.09
    # token 1: V_clip = 0.3; max((0−1)², (0.3−1)²) = 1.0
    # loss = ½ · (0.09 + 1.0) / 2 = 0.2725
    assert out.loss.item() == pytest.approx(0.2725, abs=1e-6)
    assert out.clip_fraction.item() == pytest.approx(0.5)


def test_whiten_uses_only_real_tokens():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # mean 2, unbiased var 1 -> [−1, 0, 1], padding stays 0
    torch.testing.assert_close(whiten(values, mask, eps=0.0), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))


def _textbook_gae(rewards, values, mask, gamma, lam):
    """GAE as the PPO papers write it for one completion (V = 0 after the last real
    token), kept here as the reference the one GAE must equal on single-turn rows."""
    values = values * mask
    length = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages * mask, (advantages + values) * mask


def _textbook_kl_rewards(scores, logprobs, ref_logprobs, mask, kl_coef):
    """The single-turn KL-penalised reward: the score on the last real token."""
    kl = (logprobs - ref_logprobs) * mask
    terminal = torch.zeros_like(kl)
    terminal[torch.arange(kl.shape[0]), (mask.sum(dim=1).long() - 1).clamp(min=0)] = scores * (mask.sum(dim=1) > 0)
    return (-kl_coef * kl + terminal) * mask, kl


def test_one_path_reproduces_single_turn_ppo_bit_for_bit():
    """S-PATH-1: a single-turn row is a one-turn episode. Over random batches with
    prefix masks (empty rows included), the one KL reward over per-token scores and the
    one GAE give exactly the textbook single-turn numbers, not merely close ones."""
    generator = torch.Generator().manual_seed(0)
    for case in range(200):
        b, r = 1 + case % 5, 1 + case % 9
        lengths = torch.randint(0, r + 1, (b,), generator=generator)
        mask = (torch.arange(r) < lengths[:, None]).float()
        scores = torch.randn(b, generator=generator)
        logprobs, ref, values = (torch.randn(b, r, generator=generator) for _ in range(3))
        gamma, lam = float(torch.rand(1, generator=generator)), float(torch.rand(1, generator=generator))
        expected_rewards, expected_kl = _textbook_kl_rewards(scores, logprobs * mask, ref, mask, 0.05)
        rewards, kl = kl_penalised_rewards(last_action_scores(scores, mask), logprobs * mask, ref, mask, 0.05)
        assert torch.equal(rewards, expected_rewards) and torch.equal(kl, expected_kl), case
        expected = _textbook_gae(rewards, values, mask, gamma, lam)
        assert all(torch.equal(a, e) for a, e in zip(generalized_advantage_estimate(rewards, values, mask, gamma, lam),
                                                     expected)), case


def test_gae_steps_over_observations():
    """S-ENV-2: observation tokens are not time steps: a row with an observation gives,
    on its actions, the GAE of the same actions laid end to end, and nothing on the
    observation."""
    torch.manual_seed(3)
    rewards, values = torch.randn(1, 7), torch.randn(1, 7)
    actions = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
    kept = actions[0].bool()
    advantages, returns = generalized_advantage_estimate(rewards * actions, values, actions, 0.9, 0.8)
    compact = _textbook_gae(rewards[:, kept], values[:, kept], torch.ones(1, int(kept.sum())), 0.9, 0.8)
    assert torch.allclose(advantages[0, kept], compact[0][0]) and torch.allclose(returns[0, kept], compact[1][0])
    assert advantages[0, ~kept].abs().sum() == 0 and returns[0, ~kept].abs().sum() == 0


def test_turn_rewards_and_the_kl_penalty_sit_on_the_sampled_tokens_only():
    actions = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    turn_rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0, 0.0]])
    logprobs, ref = torch.full((1, 6), -1.0), torch.full((1, 6), -1.5)
    rewards, kl = kl_penalised_rewards(turn_rewards, logprobs, ref, actions, kl_coef=0.1)
    assert torch.allclose(rewards, torch.tensor([[-0.05, 0.45, 0.0, 0.0, 0.95, 0.0]]))
    assert torch.equal(kl, 0.5 * actions)
