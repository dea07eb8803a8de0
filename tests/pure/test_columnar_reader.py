"""Rows as `datasets` keeps them (S-BYO-4): a parquet file, a folder of parquet shards and
a save_to_disk folder read into the same prompts as the same rows in JSONL, and refused
with the row number and the key, as JSONL rows are (S-DATA-4, S-DATA-5)."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")

from data.columnar_reader import ColumnarReadError, columnar_source  # noqa: E402
from data.prompt_projection import PromptError, project_prompt, project_reference  # noqa: E402
from data.sources import dataset_name_problem, iter_path_rows  # noqa: E402

ROWS = [
    {"prompt": [{"role": "user", "content": f"{i}+1="}], "reference": str(i + 1), "source": "sums"}
    for i in range(5)
]


def _projected(path: str, split: str = "train") -> list[tuple]:
    return [
        (project_prompt(r.value, where=r.where), project_reference(r.value, reference_key="reference", where=r.where),
         r.value["source"])
        for r in iter_path_rows(path, split)
    ]


def _jsonl(tmp_path, rows) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _parquet(path, rows) -> str:
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def test_every_layout_reads_into_the_prompts_of_the_same_jsonl(tmp_path):
    expected = _projected(_jsonl(tmp_path, ROWS))
    assert expected[0] == ([{"role": "user", "content": "0+1="}], "1", "sums")

    parquet = _parquet(tmp_path / "rows.parquet", ROWS)
    shards = tmp_path / "shards"
    shards.mkdir()
    _parquet(shards / "part-00000.parquet", ROWS[:2])
    _parquet(shards / "part-00001.parquet", ROWS[2:])
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict(
        train=datasets.Dataset.from_list(ROWS), test=datasets.Dataset.from_list(ROWS[:1])
    ).save_to_disk(str(tmp_path / "saved_dict"))

    assert _projected(parquet) == expected
    assert _projected(str(shards)) == expected
    assert _projected(str(tmp_path / "saved")) == expected
    assert _projected(str(tmp_path / "saved_dict"), "train") == expected
    assert _projected(str(tmp_path / "saved_dict"), "test") == expected[:1]
    # Positions are row numbers in reading order; a shard folder also names the shard.
    assert [r.where for r in iter_path_rows(str(shards))][2:4] == [
        f"{shards} row 2 (part-00001.parquet row 0)", f"{shards} row 3 (part-00001.parquet row 1)"
    ]
    assert next(iter_path_rows(str(tmp_path / "saved_dict"), "test")).where == f"{tmp_path / 'saved_dict'}[test] row 0"


def test_parquet_is_recognised_by_its_magic_bytes_not_its_name(tmp_path):
    renamed = _parquet(tmp_path / "rows.data", ROWS)
    assert columnar_source(renamed).kind == "parquet file"
    assert _projected(renamed) == _projected(_jsonl(tmp_path, ROWS))
    assert columnar_source(_jsonl(tmp_path, ROWS)) is None  # JSON rows stay with the row reader
    fake = tmp_path / "fake.parquet"
    fake.write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(ColumnarReadError, match=r"named \.parquet but does not start with parquet's magic bytes PAR1"):
        columnar_source(str(fake))


def test_shards_named_by_split_are_read_one_split_at_a_time(tmp_path):
    _parquet(tmp_path / "train-00000.parquet", ROWS)
    _parquet(tmp_path / "test-00000.parquet", ROWS[:2])
    assert len(list(iter_path_rows(str(tmp_path), "test"))) == 2
    assert len(list(iter_path_rows(str(tmp_path), "train"))) == 5
    with pytest.raises(ColumnarReadError, match=r"splits train, test .* none of the split 'validation'"):
        list(iter_path_rows(str(tmp_path), "validation"))
    unsplit = tmp_path / "unsplit"
    unsplit.mkdir()
    _parquet(unsplit / "part-0.parquet", ROWS)
    with pytest.raises(ColumnarReadError, match=r"splits train \(from their file names\) but none of the split 'test'"):
        list(iter_path_rows(str(unsplit), "test"))  # unnamed shards are one split, `train`, as `datasets` reads them


def test_a_bad_row_is_named_by_its_row_number_and_key_as_in_jsonl(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[3]["prompt"] = [{"role": "user", "content": ""}]
    for path in (_jsonl(tmp_path, rows), _parquet(tmp_path / "bad.parquet", rows)):
        with pytest.raises(PromptError, match=r"row 3\b.*`prompt\[0\]\.content` is an empty string") as caught:
            _projected(path)
        assert caught.value.key_path == "prompt[0].content"
    wrong_type = [{"prompt": r["prompt"], "reference": float(i), "source": "sums"} for i, r in enumerate(ROWS)]
    with pytest.raises(PromptError, match=r"wrong\.parquet row 0: `reference` is a number; accepted: a reference"):
        _projected(_parquet(tmp_path / "wrong.parquet", wrong_type))


def test_arrow_null_fill_is_refused_naming_the_row_and_the_part(tmp_path):
    # Arrow gives the text part the image part's key, as null (S-DATA-5).
    rows = [
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "reference": "1"},
        {"prompt": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}], "reference": "2"},
    ]
    path = _parquet(tmp_path / "mixed.parquet", rows)
    refusal = r"mixed\.parquet row 0: `prompt\[0\]\.content\[0\]\.image` is null .*JSON lines"
    with pytest.raises(PromptError, match=refusal):
        [project_prompt(r.value, where=r.where) for r in iter_path_rows(path)]


def test_folders_and_splits_that_cannot_be_read_are_refused_with_the_fix(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ColumnarReadError, match="holds neither a saved dataset nor parquet files.*save_to_disk"):
        columnar_source(str(tmp_path))
    datasets.DatasetDict(train=datasets.Dataset.from_list(ROWS)).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ColumnarReadError, match=r"without the split 'test' \(rl.data.split\); its splits: train"):
        columnar_source(str(tmp_path / "dict"), "test")


def test_dataset_names_that_cannot_give_rows_are_found_before_any_read(tmp_path):
    assert "Set rl.data.path to your file or folder" in dataset_name_problem("parquet", "train")
    assert "rl.data.name=null" in dataset_name_problem("json", "train")
    assert dataset_name_problem("openai/gsm8k", "train") is None  # a hub name: read by the data role
    folder = tmp_path / "hub_layout"
    folder.mkdir()
    _parquet(folder / "train-00000-of-00001.parquet", ROWS)
    assert dataset_name_problem(str(folder), "train") is None
    assert "no split 'test' (rl.data.split); the splits `datasets` finds there, from its file names: train" in (
        dataset_name_problem(str(folder), "test")
    )
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert f"set rl.data.path={tmp_path / 'saved'} instead" in dataset_name_problem(str(tmp_path / "saved"), "train")
    assert "is not a folder" in dataset_name_problem(str(tmp_path / "missing"), "train")
