"""transformers' private internals, used only on the versions they were written against.

FSDP wraps each transformer block on its own (trainer/sharding.py): the classes a
model declares unsplittable in its private `_no_split_modules` name them. Outside
`WRITTEN_FOR` none are declared, and the caller's public fallback (the model's longest
`ModuleList`, its layer stack) finds the blocks.
"""

from __future__ import annotations

from typing import Any

from packaging.specifiers import SpecifierSet

from compat.versions import within

WRITTEN_FOR = SpecifierSet(">=5.19,<5.20")


def declared_blocks(model: Any) -> set[str]:
    """The class names `model` declares as blocks never to split; empty when it
    declares none, or outside the range."""
    if not within("transformers", WRITTEN_FOR, "the blocks a model declares (_no_split_modules)",
                  "its longest ModuleList"):
        return set()
    return set(getattr(model, "_no_split_modules", None) or ())
