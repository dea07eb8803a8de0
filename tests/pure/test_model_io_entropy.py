"""The policy's entropy comes from the forward the loss already runs (issue 15): the
log-probs are bit-identical to `response_logprobs`, and the entropy is at the rollout
temperature and carries no gradient."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from models.model_io import response_logprobs


class FixedLogits(torch.nn.Module):
    """A 'model' whose next-token logits over V = 2 are [0, 2·ln 3] at every position."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: object) -> SimpleNamespace:
        row = torch.tensor([0.0, 2 * math.log(3)])
        return SimpleNamespace(logits=self.scale * row.expand(*input_ids.shape, 2))


def test_entropy_at_the_rollout_temperature_beside_identical_logprobs():
    model = FixedLogits()
    input_ids = torch.tensor([[0, 1, 1, 0]])  # p = 2, r = 2
    attention_mask = torch.ones_like(input_ids)
    logprobs, entropy = response_logprobs(model, input_ids, attention_mask, 2, temperature=2.0, with_entropy=True)
    # At T = 2 the logits are [0, ln 3]: π = [1/4, 3/4], H = ln 4 − ¾·ln 3 ≈ 0.5623.
    expected = math.log(4) - 0.75 * math.log(3)
    torch.testing.assert_close(entropy, torch.full((1, 2), expected))
    assert torch.equal(logprobs, response_logprobs(model, input_ids, attention_mask, 2, temperature=2.0))
    assert logprobs.requires_grad and not entropy.requires_grad
