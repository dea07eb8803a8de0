"""The samples table of the Prefect UI (S-OPS-3): a few short rows per iteration, and
nothing at all outside a task run (the in-process runner has no UI)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from configs.loading import ConfigError, load_config
from contracts.experience import ExperienceReceipt
from views.samples_table import MAX_TEXT, SHOWN, publish_samples, samples_table
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


def test_an_episode_row_shows_its_turns_tool_calls_and_transcript():
    """S-ENV: the table shows what the agent did, not only its last answer."""
    call = '<tool_call>\n{"name": "get", "arguments": {"key": "QX"}}\n</tool_call>'
    messages = [{"role": "user", "content": "value of QX?"}, {"role": "assistant", "content": call},
                {"role": "tool", "content": "493"}, {"role": "assistant", "content": "493"}]
    receipt = _receipt()
    receipt = replace(receipt, table=[{**receipt.table[0], "messages": messages, "turns": 2, "tool_calls": 1}])
    (row,) = samples_table(receipt)
    assert row["turns"] == 2 and row["tool_calls"] == 1
    assert row["transcript"].startswith('user: value of QX? | assistant: <tool_call>\n{"name": "get"')
    assert row["transcript"].endswith("tool: 493 | assistant: 493")


class _Published:
    """Stands in for Prefect's TableArtifact and the background writer: what would
    have reached the UI, and what was sent."""

    def __init__(self, monkeypatch, in_task_run: bool) -> None:
        import views.samples_table as module

        self.tables: list[dict] = []
        self.created = 0
        self.submitted: list = []
        published = self

        class Artifact:
            def __init__(self, **fields) -> None:
                published.tables.append(fields)

            def create(self, **kwargs) -> None:
                published.created += 1

        class Writes:
            def submit(self, write, key=None) -> None:
                published.submitted.append(write)

        class Context:
            @staticmethod
            def get():
                return object() if in_task_run else None

        monkeypatch.setattr(module, "TableArtifact", Artifact)
        monkeypatch.setattr(module, "artifact_writes", lambda: Writes())
        monkeypatch.setattr(module, "TaskRunContext", Context)


def test_inside_a_task_run_the_table_is_published_under_the_key(monkeypatch):
    published = _Published(monkeypatch, in_task_run=True)
    publish_samples(_receipt(), "ppo-r-samples")
    (table,) = published.tables
    assert table["key"] == "ppo-r-samples"
    assert table["table"] == samples_table(_receipt())
    assert table["description"] == (
        "iteration 2: 1 of 16 samples; all of them in /runs/r/experience/iter_000002.jsonl.gz"
    )
    assert published.created == 0  # sent from the background, not by the task itself
    (write,) = published.submitted
    write()
    assert published.created == 1


def test_outside_a_task_run_nothing_is_published(monkeypatch):
    published = _Published(monkeypatch, in_task_run=False)
    publish_samples(_receipt(), "ppo-r-samples")
    assert published.tables == [] and published.submitted == []


def test_without_a_key_or_rows_nothing_is_published(monkeypatch):
    published = _Published(monkeypatch, in_task_run=True)
    publish_samples(_receipt(), None)
    publish_samples(replace(_receipt(), table=[]), "ppo-r-samples")
    assert published.tables == [] and published.submitted == []


def test_bad_experience_settings_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"job.experience.keep"):
        load_config(TINY_PROFILE, ["job.experience.keep=some"])
    with pytest.raises(ConfigError, match=r"job.experience.last"):
        load_config(TINY_PROFILE, ["job.experience.last=0"])
    with pytest.raises(ConfigError, match=r"job.trackers: tensorboard listed more than once"):
        load_config(TINY_PROFILE, ['job.trackers=["tensorboard", "tensorboard"]'])
