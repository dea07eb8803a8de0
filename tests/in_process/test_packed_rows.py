"""Packed rows (S-PATH-3): a micro-batch run as one row of its real tokens, positions
restarting per row and no attention mask, scores every response token as the padded
rows do, on the tiny Qwen3 model with transformers' SDPA and eager attention."""

from __future__ import annotations

import pytest
import torch

from models.model_io import load_causal_lm, load_value_model, response_logprobs, response_values
from models.packed_rows import pack_rows, takes_packed_rows


def _rows() -> tuple[torch.Tensor, torch.Tensor, int]:
    """Three rows of prompts 2, 4 and 1 tokens long (left-padded to 4) and responses of
    3, 1 and 5 tokens (right-padded to 5)."""
    generator = torch.Generator().manual_seed(0)
    prompt_lengths, response_lengths, p, r = [2, 4, 1], [3, 1, 5], 4, 5
    input_ids = torch.randint(3, 12, (3, p + r), generator=generator)
    attention_mask = torch.zeros(3, p + r, dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(prompt_lengths, response_lengths)):
        attention_mask[row, p - prompt : p + response] = 1
    return input_ids * attention_mask, attention_mask, p


def test_the_way_back_finds_each_response_token():
    input_ids, attention_mask, p = _rows()
    packed = pack_rows(input_ids, attention_mask, p)
    # T = (2 + 3) + (4 + 1) + (1 + 5) = 16 real tokens, positions restarting per row
    assert packed.input_ids.shape == (1, 16)
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]
    # row 0's response column 0 is predicted by its prompt's last token, packed position 1
    assert packed.predicting[0].tolist()[:3] == [1, 2, 3]
    assert packed.present.sum(dim=1).tolist() == [3, 1, 5]
    # the token each predicting position's next neighbour holds is the response token
    tokens = packed.input_ids[0][packed.predicting + 1]
    assert torch.equal(tokens[packed.present], input_ids[:, p:][attention_mask[:, p:].bool()])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_score_as_padded_rows(tiny_model_dir, attention):
    input_ids, attention_mask, p = _rows()
    response_mask = attention_mask[:, p:].float()
    policy = load_causal_lm(tiny_model_dir, "float32")
    policy.set_attn_implementation(attention)
    critic = load_value_model(tiny_model_dir, "float32", seed=0)
    critic.set_attn_implementation(attention)
    assert not takes_packed_rows(attention) and takes_packed_rows("flash_attention_2")
    with torch.no_grad():
        padded = response_logprobs(policy, input_ids, attention_mask, p) * response_mask
        packed = response_logprobs(policy, input_ids, attention_mask, p, pack=True) * response_mask
        torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)
        padded_values = response_values(critic, input_ids, attention_mask, p) * response_mask
        packed_values = response_values(critic, input_ids, attention_mask, p, pack=True)
        torch.testing.assert_close(packed_values, padded_values, rtol=1e-5, atol=1e-5)
    # Without the restarts the rows would read each other: the comparison above can tell.
    rows = pack_rows(input_ids, attention_mask, p)
    with torch.no_grad():
        one_sequence = rows.response(policy(input_ids=rows.input_ids).logits).log_softmax(-1)
    crossed = one_sequence.gather(2, input_ids[:, p:].unsqueeze(-1)).squeeze(-1) * response_mask
    assert (crossed[1:] - padded[1:]).abs().max() > 1e-3
