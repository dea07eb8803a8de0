"""The data role in-process: sources, the cursor (S-DATA-6), and refusals at build
time (S-DATA-5)."""

from __future__ import annotations

import json

import pytest

from configs.loading import load_config
from data.prompt_projection import PromptError
from roles.data_role import DataRole
from tests.conftest import TINY_PROFILE


def _config(*overrides: str):
    return load_config(TINY_PROFILE, list(overrides))


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_cursor_continues_exactly_after_save_and_restore_across_epochs(tmp_path):
    config = _config("rl.data.factory_kwargs={\"num_rows\": 10, \"seed\": 3}")
    straight = DataRole(config)
    batches = [straight.next_batch(i, 4)[0].row_ids for i in range(1, 7)]  # 24 rows: crosses 2 epoch ends

    stopped = DataRole(config)
    for i in range(1, 3):
        stopped.next_batch(i, 4)
    stopped.save(str(tmp_path / "data"))
    resumed = DataRole(config)
    resumed.load(str(tmp_path / "data"))
    assert [resumed.next_batch(i, 4)[0].row_ids for i in range(3, 7)] == batches[2:]
    # Every row once per epoch, and epochs reshuffle deterministically.
    flat = sum(batches, [])
    assert sorted(flat[:10]) == list(range(10)) and flat[:10] != flat[10:20]


def test_conversation_rows_reach_the_batch_untouched(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "3"}], "reference": "3"},
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": "4"}]}], "reference": "4", "extra": 1},
        {"prompt": [{"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "5"}]}],
         "reference": "5"},
    ]
    config = _config(f"rl.data.path={_write_jsonl(tmp_path / 'p.jsonl', rows)}", "rl.data.shuffle=false")
    batch, _ = DataRole(config).next_batch(1, 3)
    assert batch.prompts == [r["prompt"] for r in rows]  # no keys added, no nulls filled
    assert batch.references == ["3", "4", "5"] and batch.metadata[1] == {"extra": 1}
    assert batch.sources[2].endswith("p.jsonl row 2 (line 3, column 1)")


def test_bad_row_fails_when_the_role_is_built_with_its_position(tmp_path):
    rows = [{"prompt": "1", "reference": "1"},
            {"prompt": [{"role": "user", "content": [{"type": "text", "text": "2", "image": None}]}], "reference": "2"}]
    config = _config(f"rl.data.path={_write_jsonl(tmp_path / 'bad.jsonl', rows)}")
    with pytest.raises(PromptError, match=r"bad.jsonl row 1 \(line 2, column 1\).*prompt\[0\]\.content\[0\]\.image"):
        DataRole(config)


def test_hugging_face_dataset_source_works_offline_from_a_local_folder(tmp_path):
    import datasets

    folder = tmp_path / "digits"
    folder.mkdir()
    datasets.Dataset.from_list([{"prompt": str(d), "reference": str(d)} for d in range(5)]).to_parquet(
        str(folder / "train.parquet")
    )
    role = DataRole(_config(f"rl.data.name={folder}", "rl.data.shuffle=false"))
    assert role.next_batch(1, 5)[0].prompts == ["0", "1", "2", "3", "4"]


def test_factory_must_resolve(tmp_path):
    with pytest.raises(
        ValueError, match="rl.data.factory: 'data.synthetic:nope': module 'data.synthetic' has no attribute 'nope'"
    ):
        DataRole(_config("rl.data.factory=data.synthetic:nope"))


def test_reward_without_reference_needs_runs_on_data_without_the_column(tmp_path):
    path = _write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "hello"}, {"prompt": "again"}])
    batch, _ = DataRole(_config(f"rl.data.path={path}", "rl.reward.terminal=nonempty")).next_batch(1, 2)
    assert batch.references == [None, None]
    with pytest.raises(PromptError, match="reference"):
        DataRole(_config(f"rl.data.path={path}"))  # the default rule needs the column


def test_parquet_and_saved_datasets_give_the_batch_the_jsonl_gives(tmp_path):
    # S-BYO-4: the same rows as JSONL, a parquet file and a save_to_disk folder.
    import datasets

    rows = [{"prompt": [{"role": "user", "content": f"{d}+0="}], "reference": str(d)} for d in range(4)]
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    batches = [
        DataRole(_config(f"rl.data.path={path}", "rl.data.shuffle=false")).next_batch(1, 4)[0]
        for path in (_write_jsonl(tmp_path / "rows.jsonl", rows), tmp_path / "rows.parquet", saved)
    ]
    assert [b.prompts for b in batches] == [[r["prompt"] for r in rows]] * 3
    assert [b.references for b in batches] == [["0", "1", "2", "3"]] * 3
    assert batches[1].sources[3] == f"{tmp_path / 'rows.parquet'} row 3"


def test_a_bad_parquet_row_fails_when_the_role_is_built_naming_row_and_key(tmp_path):
    import datasets

    rows = [{"prompt": "1+1=", "reference": "2"}, {"prompt": "", "reference": "3"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(PromptError, match=r"bad\.parquet row 1: `prompt` is an empty string"):
        DataRole(_config(f"rl.data.path={tmp_path / 'bad.parquet'}"))


def test_several_samples_per_prompt_repeat_each_prompt_side_by_side_and_the_cursor_counts_prompts(tmp_path):
    """S-OPT-2: the batch is the same prompts as with one sample each, each repeated in
    place with its position as group id; the cursor, hence resume, moves by prompts."""
    config = _config("rl.data.factory_kwargs={\"num_rows\": 10, \"seed\": 3}")
    single = DataRole(config)
    once = [single.next_batch(i, 4)[0] for i in range(1, 4)]  # 12 prompts: crosses an epoch end

    grouped = DataRole(config)
    first, summary = grouped.next_batch(1, 4, 3)
    assert first.row_ids == [row for row in once[0].row_ids for _ in range(3)]
    assert first.prompts == [prompt for prompt in once[0].prompts for _ in range(3)]
    assert first.group_ids == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3] and first.group_index() == first.group_ids
    assert summary["data/position"] == 4.0  # prompts taken, not rows made
    grouped.save(str(tmp_path / "data"))
    resumed = DataRole(config)
    resumed.load(str(tmp_path / "data"))
    later = [resumed.next_batch(i, 4, 3)[0] for i in (2, 3)]
    assert [batch.row_ids[::3] for batch in later] == [batch.row_ids for batch in once[1:]]
    assert once[0].group_ids == []  # one sample per prompt: the batch as it always was
