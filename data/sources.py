"""The three prompt sources of `rl.data` (S-DATA-1), each yielding rows with a
human-readable position so any refusal can say where the row came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import fsspec

from configs.callables import import_callable
from configs.schema import DataConfig


@dataclass(frozen=True)
class SourcedRow:
    value: dict[str, Any]
    where: str  # e.g. "prompts.jsonl row 3 (line 7, column 1)" or "factory data.synthetic:copy_digit row 3"


def iter_path_rows(path: str, split: str = "train") -> Iterator[SourcedRow]:
    """The rows at `rl.data.path`: parquet and saved datasets through `datasets`, JSON
    rows through the project's row reader (S-BYO-4, S-DATA-3), one `where` spelling each."""
    from data.columnar_reader import columnar_source, iter_columnar_rows

    source = columnar_source(path, split)
    if source is not None:
        for value, where in iter_columnar_rows(source):
            yield SourcedRow(value, where)
        return
    from data.row_reader import iter_rows

    for row in iter_rows(path):
        yield SourcedRow(row.value, str(row.position))


def iter_source_rows(
    data: DataConfig, key: str = "rl.data", trusted: Iterable[str] = ()
) -> Iterator[SourcedRow]:
    """`key`: the config section `data` came from (`rl.validation.data` for evaluation
    prompts), so a refusal names the key to change; `trusted`: `job.trusted_modules`."""
    if data.path:
        yield from iter_path_rows(data.path, data.split)
    elif data.factory:
        factory = import_callable(data.factory, key=f"{key}.factory", trusted=trusted)
        for index, value in enumerate(factory(**data.factory_kwargs)):
            where = f"{key}.factory {data.factory} row {index}"
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected a dict row, got {type(value).__name__}")
            yield SourcedRow(value, where)
    else:
        import datasets  # hub-style datasets; local JSON rows never go through Arrow (S-DATA-3)

        dataset = datasets.load_dataset(data.name, split=data.split)
        for index, value in enumerate(dataset):
            yield SourcedRow(dict(value), f"dataset {data.name}[{data.split}] row {index}")


def dataset_name_problem(name: str, split: str) -> str | None:
    """Why `rl.data.name` cannot give rows, found before Ray starts; None when it may.

    A hub name is only read by the data role (no download here); a local folder and
    its split, and a `datasets` reader's own name, are checked (S-BYO-4)."""
    import importlib.util
    import os

    from data.columnar_reader import local_dataset_splits_files, save_to_disk_marks

    if os.path.isdir(name):
        if save_to_disk_marks(fsspec.filesystem("file"), name) is not None:
            return (
                f"{name} is a folder written by `datasets`' save_to_disk, which load_dataset does not read; "
                f"set rl.data.path={name} instead (and rl.data.split for a DatasetDict)"
            )
        try:
            splits = list(local_dataset_splits_files(name))
        except Exception as error:  # datasets' own refusal (no data files, mixed formats) says why
            return f"{name}: `datasets` finds no dataset in this folder: {type(error).__name__}: {error}"
        if split not in splits:
            return (
                f"the folder {name} has no split {split!r} (rl.data.split); the splits `datasets` finds there, "
                f"from its file names: {', '.join(splits) or 'none'}. Set rl.data.split to one of them"
            )
        return None
    if name.startswith((".", "/", "~")):
        return f"{name} is not a folder (a local dataset folder must exist; a hub dataset is named like org/name)"
    if name.isidentifier() and importlib.util.find_spec(f"datasets.packaged_modules.{name}") is not None:
        return (
            f"{name!r} is the name of one of `datasets`' file readers, not a dataset: with no files it reads "
            f"whatever lies in the working directory. Set rl.data.path to your file or folder instead "
            "(rl.data.path reads parquet files, folders of parquet shards, save_to_disk folders and JSON rows), "
            "and rl.data.name=null"
        )
    return None
