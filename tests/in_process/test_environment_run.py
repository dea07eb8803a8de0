"""A PPO run over multi-turn episodes, through the in-process runner (the flow's own
iteration program on role objects): it trains on the sampled turns only, keeps the
transcripts in its experience files, and a run stopped at a boundary and run again
ends bitwise equal to the uninterrupted one (S-ENV-2, S-ENV-3, S-CKPT-8)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from configs.loading import load_config
from configs.schema import EnvConfig
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import boundary, metric_records, weights_digest, without_timings

ENV = EnvConfig(
    factory="tests.in_process.test_episodes:CountingEnv",
    factory_kwargs={"turns": 3, "reward_turn": 2},
    max_turns=3,
    max_turn_tokens=12,
    max_episode_tokens=60,
)


def _run(root: Path, model_dir: str, name: str, steps: int, *extra: str, stop_after: int | None = None) -> Path:
    config = load_config(TINY_PROFILE, [
        f"job.output_root={root}", f"model.path={model_dir}", f"job.name={name}", "rl.batch_size=8",
        "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", "rl.save_every=2", "rl.validation=null",
        f"rl.max_steps={steps}", *extra,
    ])
    # A test module is not trusted code an override may name (S-SEC-3): set in the
    # config itself, as a profile would.
    config = config.model_copy(update={"rl": config.rl.model_copy(update={"env": ENV})})
    stop = {} if stop_after is None else {"max_steps": stop_after}
    run_in_process(config, paths=RunPaths.for_config(config), resume=True, **stop)
    return root / name


def _experience(run_dir: Path, iteration: int) -> list[dict]:
    with gzip.open(run_dir / "experience" / f"iter_{iteration:06d}.jsonl.gz", "rt") as handle:
        return [json.loads(line) for line in handle]


def test_an_environment_run_keeps_its_transcripts_and_resumes_bitwise(tiny_model_dir, tmp_path):
    straight = _run(tmp_path, tiny_model_dir, "straight", 4)
    _run(tmp_path, tiny_model_dir, "resumed", 2)
    resumed = _run(tmp_path, tiny_model_dir, "resumed", 4)

    digests = [weights_digest(boundary(run, 4) / "policy") for run in (straight, resumed)]
    assert digests[0] == digests[1]
    records = [without_timings(r) for r in metric_records(resumed)]
    assert records == [without_timings(r) for r in metric_records(straight)]
    assert {"env/turns_mean", "env/tool_calls_mean", "env/errors", "env/cut_fraction"} <= records[0].keys()
    assert weights_digest(boundary(straight, 2) / "policy") != weights_digest(boundary(straight, 4) / "policy")

    rows = _experience(straight, 3)
    assert rows == _experience(resumed, 3)
    assert len(rows) == 8 and all(row["turns"] >= 1 for row in rows)
    multi = [row for row in rows if row["turns"] >= 2]
    assert multi, "no episode of iteration 3 reached a second turn"
    for row in multi:
        roles = [message["role"] for message in row["messages"]]
        assert roles[:4] == ["user", "assistant", "user", "assistant"]
        assert row["messages"][2]["content"] == "11"  # the environment's observation, as it said it


def test_a_shard_regenerated_on_another_engine_is_byte_identical_and_merges_like_one_batch(tiny_model_dir, tmp_path):
    """S-ENV-3 with elastic rollout: a survivor that generates a lost engine's shard
    draws the same environment seeds and sampling stream, so its episodes are the
    lost engine's byte for byte; the gathered batch keeps each row's action mask."""
    from contracts.trajectory import PromptBatch
    from roles.rollout_role import RolloutRole, merge_shards
    from tests.conftest import first_rank

    config = load_config(TINY_PROFILE, [f"job.output_root={tmp_path}", f"model.path={tiny_model_dir}"])
    config = config.model_copy(update={"rl": config.rl.model_copy(update={"env": ENV})})
    prompts = PromptBatch(3, [str(i) for i in range(4)], [None] * 4, [{}] * 4, [20, 21, 22, 23])
    first, survivor = (RolloutRole(config, first_rank(config, "rollout")) for _ in range(2))
    lost, _ = first.generate(prompts, 0, shard=1, shards=2)
    again, summary = survivor.generate(prompts, 0, shard=1, shards=2)
    for name in ("prompt_ids", "response_ids", "response_mask", "action_mask", "rollout_logprobs", "token_scores"):
        assert torch.equal(getattr(lost, name), getattr(again, name)), name
    assert lost.transcripts == again.transcripts and summary["env/turns_mean"] >= 1.0

    kept, _ = first.generate(prompts, 0, shard=0, shards=2)
    merged = merge_shards([kept, again], first.tokenizer.pad_token_id)
    assert merged.prompts.row_ids == [20, 21, 22, 23] and len(merged.transcripts) == 4
    for row, part in ((0, kept), (2, again)):
        n = part.response_ids.shape[1]
        assert torch.equal(merged.action_mask[row, :n], part.action_mask[0])
        assert merged.action_mask[row, n:].sum() == 0 and merged.token_scores[row, n:].sum() == 0


@pytest.mark.slow
def test_one_step_off_keeps_the_episodes_in_flight_and_resumes_bitwise(tiny_model_dir, tmp_path):
    """S-ENV-3 with S-ASYNC-3: the batch generated during the boundary's iteration is
    saved with its action mask, turn rewards and transcripts, and trained on after it."""
    one_step_off = "rl.rollout.max_staleness=1"
    straight = _run(tmp_path, tiny_model_dir, "straight", 4, one_step_off)
    _run(tmp_path, tiny_model_dir, "resumed", 4, one_step_off, stop_after=2)
    assert (boundary(tmp_path / "resumed", 2) / "in_flight").is_dir()
    resumed = _run(tmp_path, tiny_model_dir, "resumed", 4, one_step_off)
    assert weights_digest(boundary(resumed, 4) / "policy") == weights_digest(boundary(straight, 4) / "policy")
    records = [without_timings(r) for r in metric_records(resumed)]
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert records == [without_timings(r) for r in metric_records(straight)]
    assert _experience(resumed, 3) == _experience(straight, 3)
