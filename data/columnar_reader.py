"""Rows that are already columnar: a parquet file, a folder of parquet shards, or a
folder written by `datasets`' `save_to_disk`, read through `datasets` (S-BYO-4).

Each is recognised by its own marks, never by a name alone: a parquet file by its
magic bytes `PAR1`, a `save_to_disk` folder by `state.json` or `dataset_info.json`
beside its `.arrow` files (a DatasetDict folder by `dataset_dict.json`, the split then
chosen by `rl.data.split`). Anything else at `rl.data.path` is JSON rows, read by
data/row_reader.py. Rows come out as the dicts `datasets` gives, so they go through the
same prompt projection as JSON rows, which refuses Arrow's null-fill (S-DATA-5); their
position is the 0-based row number in the dataset's order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec

from contracts.faults import RepeatsOnRerun

__all__ = [
    "ACCEPTED_FOLDERS",
    "ColumnarReadError",
    "ColumnarSource",
    "columnar_source",
    "iter_columnar_rows",
    "local_dataset_splits_files",
    "save_to_disk_marks",
]

PARQUET_MAGIC = b"PAR1"
SAVED_DATASET_MARKS = ("state.json", "dataset_info.json")
SAVED_DICT_MARK = "dataset_dict.json"

ACCEPTED_FOLDERS = (
    "a folder at rl.data.path is read when it is a folder written by `datasets`' save_to_disk "
    "(state.json and .arrow files; a DatasetDict's dataset_dict.json, its split chosen with rl.data.split) "
    "or a folder of parquet shards (every *.parquet file directly inside it, in name order)"
)


class ColumnarReadError(ValueError, RepeatsOnRerun):
    """A parquet file or a dataset folder cannot be read; the message names the path and the fix."""


@dataclass(frozen=True)
class ColumnarSource:
    """What was recognised at a path, and the files `datasets` is asked to read."""

    path: str
    kind: str  # "parquet file", "parquet folder", "save_to_disk folder"
    files: tuple[str, ...] = ()  # the parquet files, in reading order
    split: str | None = None  # a DatasetDict folder's split, or the split named by a folder's shards

    def where(self, row: int, shard: tuple[str, int] | None = None) -> str:
        """One spelling for a row's position, like the row reader's `path row R (...)`."""
        name = f"{self.path}[{self.split}]" if self.split else self.path
        inside = f" ({shard[0]} row {shard[1]})" if shard is not None and len(self.files) > 1 else ""
        return f"{name} row {row}{inside}"


def save_to_disk_marks(fs: Any, folder: str) -> str | None:
    """"dataset" or "dict" when `folder` holds a `save_to_disk` folder's marks, else None."""
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(folder, detail=False)}
    if SAVED_DICT_MARK in names:
        return "dict"
    if names & set(SAVED_DATASET_MARKS) and any(name.endswith(".arrow") for name in names):
        return "dataset"
    return None


def _split_names(fs: Any, folder: str) -> list[str]:
    import json

    with fs.open(f"{folder}/{SAVED_DICT_MARK}", "r") as handle:
        return list(json.load(handle).get("splits", []))


def columnar_source(path: str, split: str = "train") -> ColumnarSource | None:
    """What `path` holds, when `datasets` must read it; None for a file of JSON rows.

    Raises ColumnarReadError for a folder that is none of the accepted kinds, a
    DatasetDict without `split`, or a file named `.parquet` that is not parquet."""
    fs, local = fsspec.core.url_to_fs(path)
    if fs.isdir(local):
        marks = save_to_disk_marks(fs, local)
        if marks == "dict":
            splits = _split_names(fs, local)
            if split not in splits:
                raise ColumnarReadError(
                    f"{path} is a DatasetDict folder (save_to_disk) without the split {split!r} "
                    f"(rl.data.split); its splits: {', '.join(splits) or 'none'}. Set rl.data.split to one of them"
                )
            return ColumnarSource(path, "save_to_disk folder", split=split)
        if marks == "dataset":
            return ColumnarSource(path, "save_to_disk folder")
        entries = sorted(fs.ls(local, detail=True), key=lambda entry: entry["name"])
        shards = [e["name"] for e in entries if e["type"] == "file" and e["name"].endswith(".parquet")]
        if shards:
            files = tuple(fs.unstrip_protocol(s) for s in shards)
            chosen, named_split = _split_shards(path, files, split)
            return ColumnarSource(path, "parquet folder", chosen, split=named_split)
        nested = fs.glob(f"{local}/**/*.parquet")
        hint = (
            f"; it holds parquet files in sub-folders ({nested[0].removeprefix(local).lstrip('/')} ...): "
            "set rl.data.path to the folder that holds one split's shards"
            if nested else ""
        )
        raise ColumnarReadError(
            f"{path} is a folder that holds neither a saved dataset nor parquet files{hint}; {ACCEPTED_FOLDERS}. "
            "A file of JSON rows is given by its own path"
        )
    with fs.open(local, "rb") as handle:
        head = handle.read(len(PARQUET_MAGIC))
    if head == PARQUET_MAGIC:
        return ColumnarSource(path, "parquet file", (fs.unstrip_protocol(local),))
    if local.endswith(".parquet"):
        raise ColumnarReadError(
            f"{path} is named .parquet but does not start with parquet's magic bytes PAR1 "
            f"(it starts with {head.hex(' ') or 'nothing'}); write it again with a parquet writer "
            "(datasets' to_parquet, pandas' to_parquet, pyarrow)"
        )
    return None


def local_dataset_splits_files(name: str) -> dict[str, list[str]]:
    """The splits `datasets.load_dataset(name)` finds in a local folder of data files,
    from their names (`train-*.parquet`, `test.jsonl`, ...), and each one's files;
    no row is read."""
    import datasets

    builder = datasets.load_dataset_builder(name)
    return {str(split): [str(f) for f in files] for split, files in (builder.config.data_files or {}).items()}


def _split_shards(path: str, files: tuple[str, ...], split: str) -> tuple[tuple[str, ...], str | None]:
    """The shards of `split` when their names carry splits as `datasets` reads them
    (`train-00000.parquet`, `test.parquet`); else every shard, one split."""
    try:
        by_split = local_dataset_splits_files(path)
    except Exception:  # no split in the names (or a remote folder): every shard is the data
        return files, None
    if len(by_split) <= 1 and (split in by_split or not by_split):
        return files, None
    if split not in by_split:
        raise ColumnarReadError(
            f"{path} holds parquet shards of the splits {', '.join(by_split)} (from their file names) but none "
            f"of the split {split!r} (rl.data.split). Set rl.data.split to one of them"
        )
    chosen = {file.rsplit("/", 1)[-1] for file in by_split[split]}
    return tuple(file for file in files if file.rsplit("/", 1)[-1] in chosen), split


def _shard_sizes(files: tuple[str, ...]) -> list[int]:
    import pyarrow.parquet as pq

    sizes = []
    for file in files:
        with fsspec.open(file, "rb") as handle:
            sizes.append(pq.ParquetFile(handle).metadata.num_rows)
    return sizes


def _load(source: ColumnarSource) -> Any:
    import datasets

    progress = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a check that reads every row prints one line, not bars
    try:
        if source.kind == "save_to_disk folder":
            loaded = datasets.load_from_disk(source.path)
            return loaded[source.split] if source.split else loaded
        return datasets.load_dataset("parquet", data_files=list(source.files), split="train")
    except Exception as error:  # a damaged file: name it, and stop (a rerun reads the same bytes)
        raise ColumnarReadError(
            f"{source.path}: `datasets` cannot read this {source.kind}: {type(error).__name__}: {error}"
        ) from error
    finally:
        if progress:
            datasets.enable_progress_bars()


def iter_columnar_rows(source: ColumnarSource) -> Iterator[tuple[dict[str, Any], str]]:
    """Every row of `source` in order, as (row dict, where), row 0 first."""
    dataset = _load(source)
    shard_ends: list[tuple[str, int]] = []
    if len(source.files) > 1:
        end = 0
        for file, size in zip(source.files, _shard_sizes(source.files)):
            end += size
            shard_ends.append((file.rsplit("/", 1)[-1], end))
    shard, shard_start = 0, 0
    for index, value in enumerate(dataset):
        while shard_ends and index >= shard_ends[shard][1]:
            shard_start = shard_ends[shard][1]
            shard += 1
        inside = (shard_ends[shard][0], index - shard_start) if shard_ends else None
        yield dict(value), source.where(index, inside)
