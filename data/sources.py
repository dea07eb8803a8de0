"""The three prompt sources of `rl.data` (S-DATA-1), each yielding rows with a
human-readable position so any refusal can say where the row came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from configs.callables import import_callable
from configs.schema import DataConfig


@dataclass(frozen=True)
class SourcedRow:
    value: dict[str, Any]
    where: str  # e.g. "prompts.jsonl row 3 (line 7, column 1)" or "factory data.synthetic:copy_digit row 3"


def iter_source_rows(
    data: DataConfig, key: str = "rl.data", trusted: Iterable[str] = ()
) -> Iterator[SourcedRow]:
    """`key`: the config section `data` came from (`rl.validation.data` for evaluation
    prompts), so a refusal names the key to change; `trusted`: `job.trusted_modules`."""
    if data.path:
        from data.row_reader import iter_rows

        for row in iter_rows(data.path):
            pos = row.position
            yield SourcedRow(row.value, f"{pos.path} row {pos.row} (line {pos.line}, column {pos.column})")
    elif data.factory:
        factory = import_callable(data.factory, key=f"{key}.factory", trusted=trusted)
        for index, value in enumerate(factory(**data.factory_kwargs)):
            where = f"{key}.factory {data.factory} row {index}"
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected a dict row, got {type(value).__name__}")
            yield SourcedRow(value, where)
    else:
        import datasets  # only for hub-style datasets; local files never go through Arrow (S-DATA-3)

        dataset = datasets.load_dataset(data.name, split=data.split)
        for index, value in enumerate(dataset):
            yield SourcedRow(dict(value), f"dataset {data.name}[{data.split}] row {index}")
