"""A PPO run over multi-turn episodes, through the in-process runner (the flow's own
iteration program on role objects): it trains on the sampled turns only, keeps the
transcripts in its experience files, and a run stopped at a boundary and run again
ends bitwise equal to the uninterrupted one (S-ENV-2, S-ENV-3, S-CKPT-8)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

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


def _run(root: Path, model_dir: str, name: str, steps: int) -> Path:
    config = load_config(TINY_PROFILE, [
        f"job.output_root={root}", f"model.path={model_dir}", f"job.name={name}", "rl.batch_size=8",
        "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", "rl.save_every=2", "rl.validation=null",
        f"rl.max_steps={steps}",
    ])
    # A test module is not trusted code an override may name (S-SEC-3): set in the
    # config itself, as a profile would.
    config = config.model_copy(update={"rl": config.rl.model_copy(update={"env": ENV})})
    run_in_process(config, paths=RunPaths.for_config(config), resume=True)
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
