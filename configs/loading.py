"""Profiles, `key=value` overrides and validation errors that name the key (S-RUN-2).

A profile is a Python file defining `CONFIG: PPOConfig`; overrides are applied on the
profile's plain-dict form and the result is validated once, so a bad override is
reported exactly like a bad profile value: by its dotted key path.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from configs.callables import override_trust_problems
from configs.code_folders import code_dirs_of, use_code_dirs
from contracts.faults import RepeatsOnRerun
from configs.schema import PPOConfig


DATA_SOURCE_KEYS = {"rl.data.path", "rl.data.name", "rl.data.factory"}

PROFILE_DIRS_ENV = "PPO_PROFILE_DIRS"
"""Colon-separated directories, besides configs/, whose profiles a flow run may load; the
loaded profile's own folder is then the run's code folder (configs/code_folders.py)."""


class ConfigError(ValueError, RepeatsOnRerun):
    """Every problem found, one per line, each starting with its dotted key path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))


def profile_dirs() -> list[Path]:
    """Where a flow run's `profile` may point (S-SEC-2): the project's configs/ and
    the directories the operator names in PPO_PROFILE_DIRS."""
    named = [Path(part) for part in os.environ.get(PROFILE_DIRS_ENV, "").split(os.pathsep) if part]
    return [Path(__file__).resolve().parent, *(directory.resolve() for directory in named)]


def check_profile_path(profile: str | Path, allowed_dirs: Iterable[Path]) -> None:
    """Refuse a profile outside ``allowed_dirs`` before anything executes it: a
    profile is Python, so a deployment parameter naming any file would run it.
    The real path is compared, so `..` and symlinks pointing out are refused too."""
    allowed = list(allowed_dirs)
    real = Path(profile).resolve()
    if not any(real.is_relative_to(directory) for directory in allowed):
        shown = ", ".join(str(directory) for directory in allowed)
        raise ConfigError([
            f"profile: {str(profile)!r} resolves to {str(real)!r}, outside the profile directories ({shown}); "
            f"put the file under configs/ or name its directory in {PROFILE_DIRS_ENV}"
        ])


def allow_profile_dir(directory: str | Path) -> None:
    """Add ``directory`` to this process's PPO_PROFILE_DIRS: the CLI trusts the
    directory of the --config file its operator named, so the flow it then runs
    in this process loads that file (docs/launch.md, "Which profiles load, and where your modules import from")."""
    named = [part for part in os.environ.get(PROFILE_DIRS_ENV, "").split(os.pathsep) if part]
    resolved = str(Path(directory).resolve())
    if resolved not in named:
        os.environ[PROFILE_DIRS_ENV] = os.pathsep.join([*named, resolved])


def load_profile(profile: str | Path, *, allowed_dirs: Iterable[Path] | None = None) -> PPOConfig:
    """Execute the profile and return its CONFIG; with ``allowed_dirs`` (a flow
    run's parameter) only a file inside one of them is executed."""
    path = Path(profile)
    if allowed_dirs is not None:
        check_profile_path(profile, allowed_dirs)
    if not path.is_file():
        raise ConfigError([
            f"profile: no such file {str(profile)!r} "
            "(expected a Python file defining CONFIG, e.g. configs/ppo_tiny_cpu.py)"
        ])
    spec = importlib.util.spec_from_file_location(f"_ppo_profile_{path.stem}", path)
    if spec is None or spec.loader is None:  # not a .py file: nothing could load it
        raise ConfigError([f"profile: {str(profile)!r} is not a Python file (a profile is a .py file defining CONFIG)"])
    module = importlib.util.module_from_spec(spec)
    use_code_dirs(code_dirs_of(path))  # the modules beside it import here, the profile's own imports included
    try:
        spec.loader.exec_module(module)
    except ValidationError as error:
        raise ConfigError(profile_problems(error, path)) from None
    config = getattr(module, "CONFIG", None)
    if not isinstance(config, PPOConfig):
        raise ConfigError([f"profile: {path} must define CONFIG = PPOConfig(...) (found {type(config).__name__})"])
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """`rl.max_steps=5` -> ("rl.max_steps", 5). Values are JSON when they parse as JSON
    (numbers, true/false, null, lists), otherwise plain strings."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError([f"override {text!r}: expected key=value, e.g. rl.max_steps=5"])
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    except (ValueError, RecursionError) as error:
        # Valid JSON that Python will not build (an integer over 4300 digits, nesting
        # deeper than the recursion limit): refused by key, not as a bare traceback.
        shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error).split(";")[0]
        raise ConfigError([f"{key.strip()}: override value {shown!r} cannot be read ({reason})"]) from None
    return key.strip(), value


def apply_overrides(config: PPOConfig, overrides: Iterable[str]) -> PPOConfig:
    tree = config.model_dump(mode="python")
    problems: list[str] = []
    parsed: list[tuple[str, object]] = []
    for text in overrides:
        try:
            parsed.append(parse_override(text))
        except ConfigError as error:
            problems.extend(error.problems)
    overridden = {key for key, _ in parsed}
    if overridden & DATA_SOURCE_KEYS:
        # Choosing a prompt source on the command line replaces the profile's source
        # rather than clashing with it.
        for key in DATA_SOURCE_KEYS - overridden:
            tree["rl"]["data"][key.rsplit(".", 1)[1]] = None
    for key, value in parsed:
        problem = _set_dotted(tree, key, value, PPOConfig)
        if problem:
            problems.append(problem)
    if problems:
        # Report value errors of the known keys too, not just the unknown ones.
        try:
            validate_tree(tree)
        except ConfigError as error:
            problems.extend(p for p in error.problems if p not in problems)
        raise ConfigError(problems)
    final = validate_tree(tree)
    # S-SEC-3: before anything named by a value is found or imported.
    untrusted = override_trust_problems(config, final)
    if untrusted:
        raise ConfigError(untrusted)
    return final


def validate_tree(tree: dict[str, Any]) -> PPOConfig:
    try:
        return PPOConfig.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(_pydantic_problems(error)) from None


def load_config(
    profile: str | Path, overrides: Iterable[str] = (), *, allowed_dirs: Iterable[Path] | None = None
) -> PPOConfig:
    return apply_overrides(load_profile(profile, allowed_dirs=allowed_dirs), list(overrides))


def _set_dotted(tree: dict[str, Any], key: str, value: Any, model: type) -> str | None:
    """Walk the schema alongside the dict so an unknown key is refused by name even
    where the current value is None (an optional section not set in the profile)."""
    parts = key.split(".")
    node = tree
    current_model: Any = model
    for depth, part in enumerate(parts):
        fields = getattr(current_model, "model_fields", None)
        if fields is None or part not in fields:
            known = ", ".join(sorted(fields)) if fields else "none (not a section)"
            return f"{key}: unknown key {'.'.join(parts[: depth + 1])!r} (known here: {known})"
        if depth == len(parts) - 1:
            node[part] = value
            return None
        child_model = _section_model(fields[part].annotation)
        if not isinstance(node.get(part), dict):
            node[part] = {} if child_model is not None else node.get(part)
        if child_model is None:
            return f"{key}: {'.'.join(parts[: depth + 1])!r} is a value, not a section"
        node = node[part]
        current_model = child_model
    return None


def _section_model(annotation: Any) -> type | None:
    from typing import get_args

    from pydantic import BaseModel

    candidates = [annotation, *get_args(annotation)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def section_paths(section: str, model: type = PPOConfig, prefix: str = "") -> list[str]:
    """The dotted keys where the section class named `section` sits in the schema
    (`RLConfig` -> ["rl"]; `DataConfig` -> ["rl.data", "rl.validation.data"])."""
    if model.__name__ == section:
        return [prefix.rstrip(".")]
    found: list[str] = []
    for name, info in model.model_fields.items():
        child = _section_model(info.annotation)
        if child is not None:
            found += section_paths(section, child, f"{prefix}{name}.")
    return found


def profile_problems(error: ValidationError, profile: Path) -> list[str]:
    """A mistake in a profile read like the same mistake as an override (S-RUN-2): the
    class that refused it (`RLConfig(max_step=4)`) knows only its own keys, so the
    dotted path in front comes from where that class sits in PPOConfig, the known keys
    from the class, and the line from the profile's own frame."""
    paths = section_paths(error.title)
    line = next((frame.tb_lineno for frame in _frames(error.__traceback__)
                 if Path(frame.tb_frame.f_code.co_filename).resolve() == profile.resolve()), None)
    where = f" ({profile}{f' line {line}' if line else ''})"
    also = f"; {error.title} is also at {', '.join(paths[1:])}" if len(paths) > 1 else ""
    prefix = f"{paths[0]}." if paths and paths[0] else ""
    model = _model_named(error.title)
    problems = []
    for problem in _pydantic_problems(error):
        problem = f"{prefix}{problem}" if prefix and not problem.startswith(prefix) else problem
        if problem.endswith(": unknown key") and model is not None:
            problem += f" (known here: {', '.join(sorted(model.model_fields))})"
        problems.append(f"{problem}{where}{also}")
    return problems


def _frames(traceback: Any) -> Iterable[Any]:
    while traceback is not None:
        yield traceback
        traceback = traceback.tb_next


def _model_named(name: str, model: type = PPOConfig) -> type | None:
    if model.__name__ == name:
        return model
    for info in model.model_fields.values():
        child = _section_model(info.annotation)
        found = _model_named(name, child) if child is not None else None
        if found is not None:
            return found
    return None


def _pydantic_problems(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"] if not str(p).startswith("function-"))
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        given = item.get("input")
        shown = "" if item["type"] in ("extra_forbidden", "missing") or isinstance(given, dict) else f" (got {given!r})"
        if item["type"] == "value_error":
            # Our own validators already start their message with the key path.
            message = message.removeprefix("Value error, ")
            problems.append(message if not path or message.startswith(path) else f"{path}: {message}")
            continue
        problems.append(f"{path or '<root>'}: {message}{shown}")
    return problems
