"""Config values that name code (`package.module:callable`): `rl.data.factory`,
`rl.validation.data.factory`, `data_packer.factory`, `rl.reward.terminal_callable`,
and any key typed `CallablePath` later. They are found by walking the schema, checked
for trust before anything is imported, and resolved in one place with one error
format: every message leads with the config key and the value.

Why trust matters: a team's Prefect server lets anyone who can open the UI start a
deployment with parameters, so an override may only name code the operator already
trusts (S-SEC-3): the project's modules written to be named in a config, and the
module prefixes the profile lists in `job.trusted_modules`. A value written in the
profile itself is the operator's own choice.

Imports nothing heavy, so config validation and the reward CLI can use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, get_args, get_origin

from pydantic import AfterValidator, BaseModel

DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

PROJECT_CALLABLE_MODULES: tuple[str, ...] = (
    "data.synthetic",
    "data.synthetic_vision",
    "data.packing",
    "data.vision_packer",
    "algorithm.reward_rules",
    "algorithm.rewards",
    "environments.key_lookup",
)
"""The project's modules written to be named in a config (row factories, packers,
reward rules, environments). The rest of the project (process launchers, file
writers) is not: a function that writes or deletes files would do the attacker's
bidding with the scalar keyword arguments an override can also set."""


class _NamesCode:
    """Marks a config field whose value names code (found by `code_reference_keys`)."""

    def __repr__(self) -> str:
        return "NamesCode"


NAMES_CODE = _NamesCode()


def split_callable_path(path: str, *, key: str, error: type[Exception] = ValueError) -> tuple[str, str]:
    """(module, attribute) of `package.module:callable`; the attribute may be dotted
    (`mod:Class.method`). Raises `error` naming `key` when the value is not of that form."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not DOTTED_NAME.match(module_name) or not DOTTED_NAME.match(attribute):
        raise error(f"{key}: {path!r} is not a 'package.module:callable' path (e.g. 'my_pkg.rewards:score')")
    return module_name, attribute


def _well_formed(value: str) -> str:
    module_name, sep, attribute = value.partition(":")
    if not sep or not DOTTED_NAME.match(module_name) or not DOTTED_NAME.match(attribute):
        raise ValueError(f"{value!r} is not a 'package.module:callable' path (e.g. 'my_pkg.rewards:score')")
    return value


CallablePath = Annotated[str, AfterValidator(_well_formed), NAMES_CODE]
"""A `package.module:callable` config value: checked for form only at validation
(finding the module would import its parent packages, which is running code)."""


def within(module_name: str | None, prefixes: Iterable[str]) -> bool:
    """`module_name` is one of `prefixes` or inside one (`a.b` is within `a`; `ab` is not)."""
    if not module_name:
        return False
    return any(module_name == prefix or module_name.startswith(prefix + ".") for prefix in prefixes)


def trusted_modules(profile_trusted: Iterable[str] = ()) -> tuple[str, ...]:
    """The project's callable modules, then the prefixes the profile lists."""
    return (*PROJECT_CALLABLE_MODULES, *profile_trusted)


# --- which keys name code ------------------------------------------------------------


def _section_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _names_code(annotation: Any, metadata: list[Any]) -> bool:
    if NAMES_CODE in metadata:
        return True
    if get_origin(annotation) is Annotated:
        return NAMES_CODE in annotation.__metadata__
    return any(_names_code(arg, []) for arg in get_args(annotation))


def code_reference_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every dotted key of `model` whose value names code, nested sections included."""
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        if _names_code(info.annotation, list(info.metadata)):
            yield key
            continue
        section = _section_of(info.annotation)
        if section is not None:
            yield from code_reference_keys(section, f"{key}.")


def value_at(config: BaseModel, key: str) -> Any:
    """The value under dotted `key`, or None where a section on the way is unset."""
    node: Any = config
    for part in key.split("."):
        if node is None:
            return None
        node = getattr(node, part)
    return node


def override_trust_problems(profile: BaseModel, final: BaseModel) -> list[str]:
    """What an override may not set (S-SEC-3): a code reference outside the trusted
    modules, and the trusted list itself. Compares values only, so a section replaced
    whole (`rl={...}`) or a flow parameter is caught the same way as `key=value`.
    Reads strings only: nothing is imported."""
    problems: list[str] = []
    listed = value_at(profile, "job.trusted_modules")
    if value_at(final, "job.trusted_modules") != listed:
        problems.append(
            "job.trusted_modules: set only in the profile (the operator's file), never by an override or a "
            "deployment parameter"
        )
    if value_at(final, "rl.reward.model.url") != value_at(profile, "rl.reward.model.url"):
        # S-RM-1: a deployment parameter must not send the run's completions to another host.
        problems.append(
            "rl.reward.model.url: set only in the profile (the operator's file), never by an override or a "
            "deployment parameter"
        )
    trusted = trusted_modules(listed or ())
    for key in code_reference_keys(type(final)):
        value = value_at(final, key)
        if value is None or value == value_at(profile, key):
            continue
        module_name = value.partition(":")[0]
        if not within(module_name, trusted):
            problems.append(
                f"{key}: {value!r} names code in module {module_name!r}, which an override may not name (trusted: "
                f"{', '.join(trusted)}); write the value in the profile, or list {module_name.split('.')[0]!r} "
                "in the profile's job.trusted_modules"
            )
    return problems


# --- finding and importing -----------------------------------------------------------


def check_callable_module(path: str, *, key: str, error: type[Exception] = ValueError) -> str:
    """`path` if it is well formed and its module can be found, without importing the
    module itself (its parent packages are imported: call this only on a value that
    passed the trust check)."""
    module_name, _ = split_callable_path(path, key=key, error=error)
    try:
        found = importlib.util.find_spec(module_name)
    except ModuleNotFoundError as problem:  # a parent package that is missing
        raise error(f"{key}: {path!r}: {module_not_found(problem.name or module_name)}") from None
    except (ImportError, ValueError) as problem:  # a parent package that is missing or broken
        raise error(f"{key}: {path!r}: cannot find module {module_name!r} ({problem})") from None
    if found is None:
        raise error(f"{key}: {path!r}: {module_not_found(module_name)}")
    return path


def module_not_found(module_name: str) -> str:
    """Where a module was looked for and how to make it importable (S-BYO-3): the
    folders on the path (the profile's own among them), not the installed packages."""
    folders = dict.fromkeys(entry for entry in sys.path if entry and "-packages" not in entry and ".zip" not in entry
                            and not entry.startswith(sys.base_prefix))
    return (
        f"no module named {module_name!r} (looked in {', '.join(folders)} and the installed packages); put "
        f"{module_name.split('.')[0]}.py (or its package folder) beside the profile, which is importable in the "
        "driver and every actor, or install its package into the environment (pip install -e) or the image"
    )


def import_callable(
    path: str, *, key: str, error: type[Exception] = ValueError, trusted: Iterable[str] = ()
) -> Callable[..., Any]:
    """Import `package.module:callable` and return the callable.

    `trusted`: the profile's `job.trusted_modules`. A value naming a trusted module
    (which an override may do) must resolve to an object defined in a trusted module,
    reached without passing through another module: `data.synthetic:os.system` is
    refused although `data.synthetic` imports `os` (S-SEC-3). A value naming any other
    module can only have come from the profile, and resolves as written.

    Raises:
        error (ValueError unless the caller names its own config error): the value is
            not of the form, the module fails to import (any exception raised while
            importing user code counts), the attribute is missing, it is not
            callable, or it leaves the trusted modules. The message names `key` and
            the value.
    """
    module_name, attribute = split_callable_path(path, key=key, error=error)
    trusted_here = trusted_modules(trusted)
    checked = within(module_name, trusted_here)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as problem:
        missing = problem.name or module_name
        raise error(f"{key}: {path!r}: {module_not_found(missing)}") from problem
    except Exception as problem:
        raise error(
            f"{key}: {path!r}: cannot import module {module_name!r} ({type(problem).__name__}: {problem})"
        ) from problem
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise error(f"{key}: {path!r}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
        if checked and inspect.ismodule(target):
            raise error(
                f"{key}: {path!r} reaches through module {target.__name__!r}, which is not trusted code: name a "
                f"callable defined in {module_name!r}"
            )
    if not callable(target):
        raise error(f"{key}: {path!r} resolves to a {type(target).__name__}, not a callable")
    defined_in = getattr(target, "__module__", None)
    if checked and not within(defined_in, trusted_here):
        raise error(
            f"{key}: {path!r} resolves to {getattr(target, '__qualname__', attribute)!r} defined in module "
            f"{defined_in!r}, outside the trusted modules ({', '.join(trusted_here)}): name a callable defined in "
            f"{module_name!r}, or list its module in the profile's job.trusted_modules"
        )
    return target
