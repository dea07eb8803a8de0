"""Several samples per prompt through the real roles (S-OPT-2): two rollout engines keep a
prompt's samples on one engine, a shard regenerated on the survivor is byte-identical
(S-ELASTIC-1), a prompt's samples are different draws, its episodes face one task, and a
stopped run resumes to the uninterrupted one's bytes (S-CKPT-8)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from configs.loading import load_config
from flows.in_process import run_in_process
from roles.data_role import DataRole
from roles.rollout_role import RolloutRole, merge_shards
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE, first_rank
from tests.in_process.test_environment_run import ENV
from tests.support.helpers import boundary, metric_records, weights_digest, without_timings

# 4 prompts x 2 samples = 8 rows a batch.
GROUPED = ["rl.batch_size=4", "rl.rollout.samples_per_prompt=2", "rl.minibatch_size=8", "rl.micro_batch_size=8",
           "rl.epochs=1", "rl.rollout.max_new_tokens=4"]
TENSORS = ("prompt_ids", "response_ids", "response_mask", "action_mask", "rollout_logprobs", "token_scores")


def _config(root: Path, model_dir: str, *extra: str):
    return load_config(TINY_PROFILE, [f"job.output_root={root}", f"model.path={model_dir}", *GROUPED, *extra])


def test_two_engines_keep_a_prompts_samples_together_and_a_regenerated_shard_is_identical(tiny_model_dir, tmp_path):
    """Episodes, so the environment's seed is visible: CountingEnv opens with the
    prompt and the seed's last digit, the same for both samples of a prompt."""
    config = _config(tmp_path, tiny_model_dir, "grid.cpu_rollout_engines=2")
    config = config.model_copy(update={"rl": config.rl.model_copy(update={"env": ENV})})
    prompts, _ = DataRole(config).next_batch(3, 4, 2)
    first, survivor = (RolloutRole(config, first_rank(config, "rollout")) for _ in range(2))
    parts = [first.generate(prompts, 0, shard=shard, shards=2)[0] for shard in range(2)]
    assert [part.prompts.group_ids for part in parts] == [[0, 0, 1, 1], [2, 2, 3, 3]]  # whole prompts per engine
    again, _ = survivor.generate(prompts, 0, shard=1, shards=2)
    for name in TENSORS:
        assert torch.equal(getattr(parts[1], name), getattr(again, name)), name
    assert parts[1].transcripts == again.transcripts

    merged = merge_shards([parts[0], again], first.tokenizer.pad_token_id)
    assert merged.prompts.group_index() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert merged.prompts.row_ids[0::2] == merged.prompts.row_ids[1::2]
    openings = [transcript.messages[0]["content"] for transcript in merged.transcripts]
    assert openings[0::2] == openings[1::2]  # one task per prompt
    pairs = [(merged.transcripts[row].messages[1:], merged.transcripts[row + 1].messages[1:]) for row in (0, 2, 4, 6)]
    assert any(one != other for one, other in pairs), "every prompt's two episodes said the same: one draw, not two"


def _run(root: Path, model_dir: str, name: str, *extra: str) -> Path:
    config = _config(root, model_dir, f"job.name={name}", "rl.save_every=2", *extra)
    run_in_process(config, paths=RunPaths.for_config(config), resume=True)
    return root / name


def _experience(run_dir: Path, iteration: int) -> list[dict]:
    with gzip.open(run_dir / "experience" / f"iter_{iteration:06d}.jsonl.gz", "rt") as handle:
        return [json.loads(line) for line in handle]


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_a_run_with_two_samples_per_prompt_resumes_bitwise_and_its_rows_show_the_groups(
    tiny_model_dir, tmp_path, estimator
):
    """With grpo too: the group estimator over the groups the data role made, no critic
    committed (S-OPT-2)."""
    # grpo: the profile's one-token answers, which are right often enough that some of a
    # prompt's two samples disagree (four tokens are never right: every group would tie).
    chosen = f"rl.advantage_estimator={estimator}", *(["rl.rollout.max_new_tokens=1"] if estimator == "grpo" else [])
    straight = _run(tmp_path, tiny_model_dir, "straight", "rl.max_steps=3", *chosen)
    _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=2", *chosen)
    resumed = _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=3", *chosen)
    assert (boundary(straight, 3) / "critic").is_dir() == (estimator == "gae")
    assert weights_digest(boundary(resumed, 3) / "policy") == weights_digest(boundary(straight, 3) / "policy")
    records = [without_timings(r) for r in metric_records(resumed)]
    assert records == [without_timings(r) for r in metric_records(straight)]
    # The profile's evaluation of the starting policy: each of its 10 prompts once, not twice.
    assert records[0]["iteration"] == 0 and records[0]["val/prompts"] == 10.0
    assert [r["data/position"] for r in records[1:]] == [4.0, 8.0, 12.0]  # prompts taken, not rows made
    assert (resumed / "experience" / "iter_000003.jsonl.gz").read_bytes() == \
        (straight / "experience" / "iter_000003.jsonl.gz").read_bytes()

    rows = _experience(straight, 1)
    assert [row["group"] for row in rows] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [row["row_id"] for row in rows[0::2]] == [row["row_id"] for row in rows[1::2]]
    completions = [(one["completion"], other["completion"]) for one, other in zip(rows[0::2], rows[1::2])]
    assert any(one != other for one, other in completions), completions
    if estimator == "grpo":  # each sample against its own prompt's other sample: ±0.7071, or 0 on a tie
        rows = [row for iteration in (1, 2, 3) for row in _experience(straight, iteration)]
        for one, other in zip(rows[0::2], rows[1::2]):
            tie = one["reward"] == other["reward"]
            assert abs(one["advantage"]) == pytest.approx(0.0 if tie else 0.70710578, abs=1e-5), (one, other)
            assert one["advantage"] == pytest.approx(-other["advantage"], abs=1e-6)
        assert any(one["reward"] != other["reward"] for one, other in zip(rows[0::2], rows[1::2])), rows
