"""The names `rl.env.tool_call_format` accepts (S-BYO-5), and its default.

The formats themselves (each family's parser and the role its template answers in)
are a registry in environments/tool_call_formats.py, which registers exactly these
names, in this order, and refuses to import otherwise. The names sit in configs/
because configs/ is below environments/ (docs/architecture.md, "Import direction"):
the config refuses an unknown name, listing the known ones, without reaching up for
the parsers. A new format is one name here and one entry there.
"""

from __future__ import annotations

DEFAULT_FORMAT = "qwen3"
FORMAT_NAMES: tuple[str, ...] = ("qwen3", "llama3_json", "mistral")


def known_format(name: str) -> str:
    """`name`, or a refusal listing the known formats."""
    if name not in FORMAT_NAMES:
        raise ValueError(f"unknown tool-call format {name!r}; the known formats are: {', '.join(FORMAT_NAMES)}")
    return name
