"""Generates docs/reference/config.md from the schema, so the reference can never
drift from the code (`python -m configs.reference_doc > docs/reference/config.md`)."""

from __future__ import annotations

import sys
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from configs.schema import PPOConfig


def _type_name(annotation: object) -> str:
    if any(typing.get_origin(arg) is typing.Annotated for arg in (annotation, *typing.get_args(annotation))):
        # A `CallablePath`: a string naming code, trusted only as configs/callables.py says.
        optional = type(None) in typing.get_args(annotation)
        return "callable path | None" if optional else "callable path"
    text = str(annotation).replace("typing.", "")
    if isinstance(annotation, type):
        text = annotation.__name__
    return text.replace("NoneType", "None")


def _section(annotation: object) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        section = _section(field.annotation)
        if field.default is PydanticUndefined and field.default_factory is None:
            default = "required"
        elif section is not None:
            default = "(section)"
        else:
            value = field.default_factory() if field.default_factory is not None else field.default
            default = f"`{value!r}`"
        # The class a profile writes for this section (`rl=RLConfig(...)`), beside its dotted key.
        type_name = _type_name(field.annotation) if section is None else f"section `{section.__name__}`"
        rows.append(f"| `{key}` | {type_name} | {default} | {field.description or ''} |")
        if section is not None:
            rows.extend(_rows(section, f"{key}."))
    return rows


def reference_page(title: str, intro: list[str], columns: list[str], rows: list[str]) -> str:
    """A generated reference page: title, intro lines, one markdown table. Shared with
    docs/reference/metrics.md (`algorithm.metrics_catalogue`) so both read alike."""
    return "\n".join([
        f"# {title}", "", *intro, "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns), *rows, "",
    ])


def render() -> str:
    return reference_page(
        "Config reference",
        [
            "Generated from `configs/schema.py` by `python -m configs.reference_doc`; do not edit by hand.",
            "Set any key from the command line after `--` (`rl.max_steps=5`), or in the `overrides`",
            "list of the `ppo` flow. Values are parsed as JSON when they parse (numbers, `true`,",
            "`null`), else taken as strings. Setting one of `rl.data.path`, `rl.data.name`,",
            "`rl.data.factory` on the command line replaces the profile's data source.",
            "",
            "A profile writes the same keys as Python: each section is the class named in its type",
            "column (`PPOConfig(job=JobConfig(...), model=ModelConfig(...), rl=RLConfig(data=DataConfig(...),",
            "reward=RewardConfig(...)))`, all from `configs.schema`); docs/howto/your-own-model.md derives",
            "a profile from a bundled one.",
        ],
        ["key", "type", "default", "meaning"],
        _rows(PPOConfig, ""),
    )


if __name__ == "__main__":
    sys.stdout.write(render())
