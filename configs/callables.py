"""`package.module:callable` config values (`rl.data.factory`, `data_packer.factory`,
`rl.reward.terminal_callable`), resolved in one place with one error format: every
message leads with the config key and the value, then says what is wrong.

Imports nothing heavy, so config validation and the reward CLI can use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from typing import Any

_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def split_callable_path(path: str, *, key: str, error: type[Exception] = ValueError) -> tuple[str, str]:
    """(module, attribute) of `package.module:callable`; the attribute may be dotted
    (`mod:Class.method`). Raises `error` naming `key` when the value is not of that form."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not _DOTTED_NAME.match(module_name) or not _DOTTED_NAME.match(attribute):
        raise error(f"{key}: {path!r} is not a 'package.module:callable' path (e.g. 'my_pkg.rewards:score')")
    return module_name, attribute


def check_callable_module(path: str, *, key: str, error: type[Exception] = ValueError) -> str:
    """`path` if it is well formed and its module can be found, without importing it
    (cheap enough for config validation; the attribute is looked up when used)."""
    module_name, _ = split_callable_path(path, key=key, error=error)
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as problem:  # a parent package that is missing or broken
        raise error(f"{key}: {path!r}: cannot find module {module_name!r} ({problem})") from None
    if found is None:
        raise error(f"{key}: {path!r}: no module named {module_name!r}")
    return path


def import_callable(path: str, *, key: str, error: type[Exception] = ValueError) -> Callable[..., Any]:
    """Import `package.module:callable` and return the callable.

    Raises:
        error (ValueError unless the caller names its own config error): the value is
            not of the form, the module fails to import (any exception raised while
            importing user code counts), the attribute is missing, or it is not
            callable. The message names `key` and the value.
    """
    module_name, attribute = split_callable_path(path, key=key, error=error)
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as problem:
        raise error(
            f"{key}: {path!r}: cannot import module {module_name!r} ({type(problem).__name__}: {problem})"
        ) from problem
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise error(f"{key}: {path!r}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise error(f"{key}: {path!r} resolves to a {type(target).__name__}, not a callable")
    return target
