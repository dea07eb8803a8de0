"""The spec a local tiny model was built from, kept beside it: `model.tiny` says how to
build the model when `model.path` does not exist yet, so a spec that differs from the
one already built there must be refused by key, not trained on silently under the
other model's weights. Imports neither torch nor transformers (the launch checks it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from configs.schema import ModelConfig, TinyModelSpec

TINY_SPEC_FILE = "tiny_spec.json"


def write_tiny_spec(folder: Path, spec: TinyModelSpec) -> None:
    (folder / TINY_SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}"))
        return flat
    return {prefix: value}


def tiny_spec_differences(model: ModelConfig) -> list[tuple[str, str]]:
    """(key, message) for every `model.tiny.*` setting that differs from the spec the
    model at `model.path` was built from. A folder without a recorded spec (a model
    of the user's own, or one built before the record) is taken as it is."""
    if model.tiny is None:
        return []
    recorded_file = Path(model.path) / TINY_SPEC_FILE
    if not (Path(model.path) / "config.json").is_file() or not recorded_file.is_file():
        return []
    recorded = _flatten(json.loads(recorded_file.read_text()), "model.tiny")
    wanted = _flatten(model.tiny.model_dump(mode="json"), "model.tiny")
    return [
        (key, f"is {wanted.get(key)!r}, but the model already at {model.path} was built with {recorded.get(key)!r}; "
              "model.tiny only says how to build a model that does not exist yet: point model.path at a new folder "
              "to build this one, or drop the setting to train the existing model")
        for key in sorted(set(recorded) | set(wanted))
        if recorded.get(key) != wanted.get(key)
    ]
