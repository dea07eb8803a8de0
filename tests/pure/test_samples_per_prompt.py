"""Several samples per prompt (S-OPT-2), without a model: sizes count samples, the
engines split prompts, a shard never cuts through a prompt's samples, a prompt's
episodes share an environment seed, and the manifest and samples table say so."""

from __future__ import annotations

import io

import pytest

from cli.manifest import validate_manifest
from configs.loading import ConfigError, load_config
from contracts.experience import ExperienceReceipt
from contracts.trajectory import PromptBatch
from environments.factory import episode_seeds
from rundir.preflight import config_problems
from views.samples_table import SHOWN, samples_table
from tests.conftest import TINY_PROFILE

N2 = "rl.rollout.samples_per_prompt=2"


def _keys(problems) -> list[str]:
    return [problem.key for problem in problems]


def test_minibatches_count_samples_so_a_minibatch_may_exceed_the_prompts_but_not_the_samples():
    # 4 prompts x 4 samples = 16 samples: a minibatch of 16 is one whole step.
    config = load_config(TINY_PROFILE, ["rl.batch_size=4", "rl.rollout.samples_per_prompt=4",
                                        "rl.minibatch_size=16", "rl.micro_batch_size=8"])
    assert config.rl.samples_per_iteration == 16 and config_problems(config) == []
    with pytest.raises(ConfigError) as refused:
        load_config(TINY_PROFILE, ["rl.batch_size=4", N2, "rl.minibatch_size=16", "rl.micro_batch_size=8"])
    message = str(refused.value)
    assert "rl.minibatch_size (16) exceeds the 8 samples of an iteration" in message
    assert "rl.batch_size 4 prompts × rl.rollout.samples_per_prompt 2" in message


def test_a_minibatch_that_does_not_divide_the_samples_is_refused_naming_the_keys():
    # 6 prompts x 2 = 12 samples: 8 does not divide them (it would divide 16 prompts' worth).
    problems = config_problems(load_config(TINY_PROFILE, ["rl.batch_size=6", N2, "rl.minibatch_size=8",
                                                          "rl.micro_batch_size=8"]))
    assert _keys(problems) == ["rl.minibatch_size"]
    assert "does not divide the 12 samples of an iteration (rl.batch_size 6 prompts × " in problems[0].message
    assert "rl.rollout.samples_per_prompt 2" in problems[0].message


def test_engines_split_prompts_not_samples():
    # 3 prompts x 2 = 6 samples split evenly over 2 engines only by cutting a prompt's pair.
    uneven = ["rl.batch_size=3", N2, "rl.minibatch_size=6", "rl.micro_batch_size=6", "grid.cpu_rollout_engines=2"]
    problems = config_problems(load_config(TINY_PROFILE, uneven))
    assert _keys(problems) == ["rl.batch_size"]
    message = problems[0].message
    assert "is 3, not divisible by the 2 rollout engines (grid.cpu_rollout_engines)" in message
    assert "rl.rollout.samples_per_prompt=2" in message
    even = ["rl.batch_size=4", N2, "rl.minibatch_size=8", "rl.micro_batch_size=8", "grid.cpu_rollout_engines=2"]
    assert config_problems(load_config(TINY_PROFILE, even)) == []


def _grouped(prompts: int, n: int) -> PromptBatch:
    groups = [g for g in range(prompts) for _ in range(n)]
    rows = [100 + g for g in groups]
    return PromptBatch(1, [f"p{r}" for r in rows], [None] * len(rows), [{}] * len(rows), rows, [""] * len(rows),
                       groups)


def test_a_shard_of_prompts_keeps_each_prompts_samples_and_one_through_a_group_is_refused():
    batch = _grouped(4, 3)  # 12 rows
    shards = [batch.shard(i, 2) for i in range(2)]
    assert [s.group_ids for s in shards] == [[0, 0, 0, 1, 1, 1], [2, 2, 2, 3, 3, 3]]
    assert PromptBatch.concat(shards).group_index() == batch.group_ids
    assert [s.group_ids for s in (batch.shard(i, 4) for i in range(4))] == [[g] * 3 for g in range(4)]
    with pytest.raises(ValueError, match="shard 0 of 3 .* would split one prompt's samples over two engines"):
        batch.shard(0, 3)  # 4 rows a shard: prompt 1's samples would be rows 3 (shard 0) and 4, 5 (shard 1)
    # Without group ids every row is its own prompt, as before.
    plain = PromptBatch(1, ["a", "b"], [None, None], [{}, {}], [1, 2])
    assert plain.shard(1, 2).group_index() == [0] and plain.group_index() == [0, 1]


def test_a_prompts_episodes_share_an_environment_seed_and_one_sample_per_prompt_is_unchanged():
    rows, groups = [10, 10, 11, 11, 12, 12, 13, 13], [0, 0, 1, 1, 2, 2, 3, 3]
    seeds = episode_seeds(3, 7, rows, 0, 0, groups)
    assert seeds[0::2] == seeds[1::2] and len(set(seeds)) == 4
    # The second engine's half draws what the whole batch did (elastic regeneration, S-ENV-3).
    assert episode_seeds(3, 7, rows[4:], 4, 0, groups[4:]) == seeds[4:]
    # A prompt's seed is the seed its one sample gets with rl.rollout.samples_per_prompt=1.
    assert seeds[0::2] == episode_seeds(3, 7, [10, 11, 12, 13], first_position=0, stream=0)


def test_the_manifest_says_prompts_times_samples(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    overrides = [f"job.output_root={tmp_path}", f"model.path={tmp_path / 'model'}", "rl.rollout.samples_per_prompt=4",
                 "rl.minibatch_size=64", "rl.micro_batch_size=64"]
    assert validate_manifest(TINY_PROFILE, overrides, out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    assert "batch 64 prompts × 4 samples = 256," in text
    assert "4 completions per prompt (rl.rollout.samples_per_prompt)" in text
    assert "one completion per prompt" not in text


def test_the_samples_table_shows_the_group_only_when_rows_carry_one():
    row = {"row_id": 7, "prompt": "2+2=", "completion": "4", "reward": 1.0, "policy_version": 1}
    grouped = samples_table(ExperienceReceipt(1, "x", 4, table=[{**row, "group": 0}, {**row, "group": 0}]))
    assert [cells["group"] for cells in grouped] == [0, 0] and list(grouped[0]) == ["group", *SHOWN]
    (plain,) = samples_table(ExperienceReceipt(1, "x", 4, table=[row]))
    assert list(plain) == list(SHOWN)


def test_a_one_step_off_boundary_keeps_the_groups_and_an_older_one_reads_as_one_sample_each():
    """The in-flight batch a boundary holds (S-ASYNC-3) comes back with its group ids;
    one saved before they existed reads back as one sample per prompt."""
    import torch

    from checkpoint.in_flight import _plain, _rebuilt
    from contracts.trajectory import Trajectory

    batch = _grouped(2, 2)
    trajectory = Trajectory.one_turn(
        iteration=1, policy_version=0, prompts=batch, prompt_ids=torch.ones(4, 1, dtype=torch.long),
        prompt_mask=torch.ones(4, 1, dtype=torch.long), response_ids=torch.ones(4, 2, dtype=torch.long),
        response_mask=torch.ones(4, 2), rollout_logprobs=torch.zeros(4, 2), completions=["a", "b", "c", "d"],
    )
    saved = _plain(trajectory)
    assert _rebuilt(saved).prompts.group_index() == [0, 0, 1, 1]
    older = {**saved, "prompts": {k: v for k, v in saved["prompts"].items() if k != "group_ids"}}
    assert _rebuilt(older).prompts.group_index() == [0, 1, 2, 3]
