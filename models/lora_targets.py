"""Which `model.lora.target_modules` name no module of a model, answered from weight
names alone (no torch, no model built), so the pre-flight can refuse a config in well
under a second, before any worker starts (S-LORA-1).

PEFT matches a target against a module's full name or its last dotted parts
(`q_proj` matches `model.layers.0.self_attn.q_proj`); the same rule is applied here to
the modules that own the checkpoint's weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from models.weight_shapes import checkpoint_weight_names

TARGETS_KEY = "model.lora.target_modules"
# PEFT's description of a LoRA model's adapters (rank, targets, the base model's path),
# beside them in a save, a boundary's role folder or an export.
ADAPTER_CONFIG_FILE = "adapter_config.json"


def matches(target: str, module_name: str) -> bool:
    """PEFT's rule for a plain (non-regex) target name."""
    return module_name == target or module_name.endswith("." + target)


def unmatched_targets(targets: Sequence[str], module_names: Iterable[str]) -> list[str]:
    names = list(module_names)
    return [target for target in targets if not any(matches(target, name) for name in names)]


def targets_message(missing: Sequence[str], module_names: Iterable[str]) -> str:
    """The refusal, naming the key, what did not match and what the model does have."""
    leaves = sorted({name.rsplit(".", 1)[-1] for name in module_names if name})
    return (
        f"{', '.join(missing)} name(s) no module of the model; its modules are named (last part) "
        f"{', '.join(leaves[:30])}{' ...' if len(leaves) > 30 else ''}; set {TARGETS_KEY} to its linear layers"
    )


def checkpoint_module_names(model_dir: str) -> list[str] | None:
    """Names of the modules that own a local checkpoint's weights (`a.b.weight` -> `a.b`),
    or None when the folder holds no safetensors checkpoint to read (a hub id not yet
    downloaded, the tiny model not yet built): the role then checks the built model."""
    weights = checkpoint_weight_names(Path(model_dir))
    if weights is None:
        return None
    return sorted({name.rsplit(".", 1)[0] for name in weights if "." in name})
