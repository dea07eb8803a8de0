"""Several rollout engines, one shard of the batch each: the gathered batch must be
laid out exactly as one engine would have packed it (roles/rollout_role.py
`merge_shards`), pixels and token types included, so reference, critic and policy
cannot tell how many engines generated it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from configs.schema import TinyModelSpec, TinyVisionSpec
from data.packing import MULTIMODAL_EXTRA
from data.packer_choice import build_packer
from models.tiny_vlm import build_tiny_vlm
from roles.rollout_role import merge_shards
from contracts.trajectory import PromptBatch, Trajectory

PAD = 0


@pytest.fixture(scope="module")
def packer(tmp_path_factory):
    return build_packer(
        str(build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", TinyModelSpec(vision=TinyVisionSpec())))
    )


def _prompts() -> PromptBatch:
    image = Image.fromarray(np.full((16, 24, 3), 90, dtype=np.uint8))
    prompts = [
        "2+2=",
        [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "text", "text": "what colour, in one long word?"},
                ],
            }
        ],
        "a much longer text prompt than the first one, to widen its shard",
        "1+1=",
    ]
    return PromptBatch(
        7, prompts, ["4", "grey", None, "2"], [{}] * 4, [10, 11, 12, 13], [f"rows.jsonl row {i}" for i in range(4)]
    )


def _generated(packer, prompts: PromptBatch, response_length: int) -> Trajectory:
    packed = packer.pack_prompts(prompts.prompts, prompts.sources)
    b = len(prompts.prompts)
    response_ids = torch.arange(1, b * response_length + 1).reshape(b, response_length)
    mask = torch.ones(b, response_length)
    mask[0, -1] = 0.0  # a row that stopped early
    return Trajectory.one_turn(
        iteration=prompts.iteration, policy_version=3, prompts=prompts, prompt_ids=packed.input_ids,
        prompt_mask=packed.attention_mask, response_ids=response_ids, response_mask=mask,
        rollout_logprobs=-mask, completions=[f"c{row}" for row in prompts.row_ids],
        extras={MULTIMODAL_EXTRA: packed.multimodal} if packed.multimodal is not None else {},
    )


def test_gathered_shards_are_the_one_engine_layout(packer):
    prompts = _prompts()
    shards = [prompts.shard(i, 2) for i in range(2)]
    assert [s.row_ids for s in shards] == [[10, 11], [12, 13]]
    parts = [_generated(packer, shards[0], 3), _generated(packer, shards[1], 5)]
    assert parts[0].prompt_length != parts[1].prompt_length  # the shards really differ in width

    merged = merge_shards(parts, packer.tokenizer.pad_token_id)
    whole = packer.pack_prompts(prompts.prompts, prompts.sources)

    assert torch.equal(merged.prompt_ids, whole.input_ids) and torch.equal(merged.prompt_mask, whole.attention_mask)
    mm, whole_mm = merged.extras[MULTIMODAL_EXTRA], whole.multimodal
    assert torch.equal(mm.token_types, whole_mm.token_types)
    for row in range(4):
        assert mm.per_sample[row].keys() == whole_mm.per_sample[row].keys()
        assert all(torch.equal(mm.per_sample[row][k], whole_mm.per_sample[row][k]) for k in mm.per_sample[row])
    # Responses: right-padded to the longest shard, masks and log-probs zero there.
    assert merged.response_ids.shape == (4, 5)
    assert (
        torch.equal(merged.response_mask[:2, 3:], torch.zeros(2, 2))
        and torch.equal(merged.rollout_logprobs[:2, 3:], torch.zeros(2, 2))
    )
    assert torch.equal(merged.response_ids[2:], parts[1].response_ids)
    assert merged.completions == ["c10", "c11", "c12", "c13"] and merged.prompts.row_ids == [10, 11, 12, 13]
    assert merged.prompts.references == ["4", "grey", None, "2"] and merged.policy_version == 3


def test_shards_sampled_under_different_versions_are_refused(packer):
    prompts = _prompts()
    parts = [_generated(packer, prompts.shard(i, 2), 2) for i in range(2)]
    stale = Trajectory(**{**parts[1].__dict__, "policy_version": 2})
    with pytest.raises(RuntimeError, match=r"different policy_versions \[2, 3\]"):
        merge_shards([parts[0], stale], PAD)


def test_a_batch_that_does_not_split_evenly_is_refused_not_cut():
    from contracts.trajectory import PromptBatch

    rows = list(range(10))
    batch = PromptBatch(1, [f"p{i}" for i in rows], [str(i) for i in rows], [{} for _ in rows], rows, ["s"] * 10)
    assert [b.row_ids for b in (batch.shard(0, 2), batch.shard(1, 2))] == [rows[:5], rows[5:]]
    with pytest.raises(ValueError, match="10 prompts cannot be cut into 4 equal shards"):
        batch.shard(3, 4)  # rows 8 and 9 would belong to no engine
