"""Stage arguments hold pending results (Ray object references, or the in-process
runner's finished calls) at the top level and inside lists, tuples and dict values;
both runners find and replace them with these two walks."""

from __future__ import annotations

from typing import Any, Callable


def pending_in(value: Any, is_pending: Callable[[Any], bool]) -> list[Any]:
    """Every pending result inside `value`, in order."""
    if is_pending(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [found for item in value for found in pending_in(item, is_pending)]
    if isinstance(value, dict):
        return [found for item in value.values() for found in pending_in(item, is_pending)]
    return []


def replace_pending(value: Any, is_pending: Callable[[Any], bool], result: Callable[[Any], Any]) -> Any:
    """`value` with every pending result replaced by `result(it)`, in the same order
    `pending_in` lists them."""
    if is_pending(value):
        return result(value)
    if isinstance(value, (list, tuple)):
        return type(value)(replace_pending(item, is_pending, result) for item in value)
    if isinstance(value, dict):
        return {key: replace_pending(item, is_pending, result) for key, item in value.items()}
    return value
