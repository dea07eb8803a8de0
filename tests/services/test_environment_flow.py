"""Multi-turn episodes through the real flow: Prefect tasks calling Ray actors, the
batch with its action mask and transcripts crossing the object store (S-ENV-1..3)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import TRUSTING_TINY_PROFILE
from tests.support.helpers import metric_records

@pytest.fixture(autouse=True)
def _trusting_profile_allowed(monkeypatch):
    """A flow run loads only profiles from the operator's folders (S-SEC-2); this test
    is the operator of the profile that trusts tests/."""
    monkeypatch.setenv("PPO_PROFILE_DIRS", str(Path(TRUSTING_TINY_PROFILE).parent))


ENV = ["rl.env.factory=tests.in_process.test_episodes:CountingEnv", "rl.env.max_turns=3",
       "rl.env.max_turn_tokens=12", "rl.env.max_episode_tokens=60"]


def test_a_flow_trains_on_episodes_and_keeps_their_transcripts(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.training import ppo

    ppo(profile=TRUSTING_TINY_PROFILE, run_name="episodes", overrides=tiny_overrides + ENV + ["rl.max_steps=1"])
    run_dir = tmp_path / "outputs" / "episodes"
    records = metric_records(run_dir)
    assert [r["iteration"] for r in records] == [1]
    assert all(r["env/turns_mean"] >= 1.0 and r["env/errors"] == 0.0 for r in records)
    with gzip.open(run_dir / "experience" / "iter_000001.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line in handle]
    assert len(rows) == 16 and all(row["messages"][0]["role"] == "user" for row in rows)
    assert all(row["messages"][1]["role"] == "assistant" for row in rows)


@pytest.mark.slow
def test_a_raising_environment_fails_the_rollout_task_naming_it_and_what_to_fix(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.failures import StageFailed
    from flows.training import ppo

    named = (r"rollout\[iter=1\] failed: EnvironmentFailed: environment tests.in_process.test_episodes:CountingEnv "
             r"\(rl.env.factory\) raised RuntimeError: the tool's database is down, at turn 1 of the episode of row")
    with pytest.raises(StageFailed, match=named) as failed:
        ppo(profile=TRUSTING_TINY_PROFILE, run_name="broken-env",
            overrides=tiny_overrides + ENV + ["rl.max_steps=1", "rl.env.factory_kwargs={\"raise_at\": 1}",
                                              "rl.env.max_turn_tokens=60", "rl.env.max_episode_tokens=200"])
    assert failed.value.repeats  # what to fix, not the resume hint
