"""The samples table of the Prefect UI (S-OPS-3): a few short rows per iteration, and
nothing at all outside a task run (the in-process runner has no UI)."""

from __future__ import annotations

import pytest

from configs.loading import ConfigError, load_config
from roles.replay_role import ExperienceReceipt
from tasks.samples_table import MAX_TEXT, SHOWN, publish_samples, samples_table
from tests.conftest import TINY_PROFILE


def _receipt() -> ExperienceReceipt:
    long_prompt = "data:image/png;base64," + "A" * 5000  # a picture in a conversation prompt
    rows = [
        {"row_id": 7, "prompt": long_prompt, "completion": "3", "reference": "3", "reward": 1.0,
         "advantage": 0.123456789, "return": 0.5, "policy_version": 2, "batch_id": "iter000002-x"},
    ]
    return ExperienceReceipt(iteration=2, path="/runs/r/experience/iter_000002.jsonl.gz", samples=16, table=rows)


def test_rows_keep_the_shown_columns_rounded_and_cut_short():
    (row,) = samples_table(_receipt())
    assert list(row) == list(SHOWN)
    assert len(row["prompt"]) == MAX_TEXT + 1 and row["prompt"].endswith("…")
    assert row["advantage"] == 0.1235


def test_outside_a_task_run_nothing_is_published(monkeypatch):
    import tasks.samples_table as module

    def refuse(*args, **kwargs):
        raise AssertionError("no API call outside a task run")

    monkeypatch.setattr(module, "TableArtifact", refuse)
    publish_samples(_receipt(), "ppo-r-samples")


def test_bad_experience_settings_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"job.experience.keep"):
        load_config(TINY_PROFILE, ["job.experience.keep=some"])
    with pytest.raises(ConfigError, match=r"job.experience.last"):
        load_config(TINY_PROFILE, ["job.experience.last=0"])
    with pytest.raises(ConfigError, match=r"job.trackers: tensorboard listed more than once"):
        load_config(TINY_PROFILE, ['job.trackers=["tensorboard", "tensorboard"]'])
