"""LoRA adapters on the trainable roles' models (S-LORA-1) and the merged weights a
plain model of the same family loads (S-LORA-3).

PEFT's `get_peft_model` wraps the policy or the critic: the base weights are frozen,
each targeted linear layer gets `lora_A` (r, in) and `lora_B` (out, r), and the
critic's value head (`score`) is a `modules_to_save` copy that trains whole. peft is
imported only when a model gets adapters, so a run with `model.lora.rank=0` never
loads it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Iterable, Iterator, Sequence

import torch

from configs.schema import LoraConfig
from models.lora_targets import ADAPTER_CONFIG_FILE, TARGETS_KEY, targets_message, unmatched_targets

ADAPTER = "default"  # PEFT's name for a model's one adapter
PEFT_PREFIX = "base_model.model."  # what PeftModel adds in front of the base model's names


def add_adapters(
    model: torch.nn.Module,
    lora: LoraConfig,
    *,
    seed: int,
    task_type: str | None = None,
    modules_to_save: Sequence[str] = (),
) -> torch.nn.Module:
    """`model` wrapped by PEFT with `lora`'s adapters. `lora_A` is drawn at random, so
    the draw is seeded here: two runs with one seed start from the same adapters."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    names = [name for name, _ in model.named_modules()]
    missing = unmatched_targets(lora.target_modules, names)
    if missing:
        raise ValueError(f"{TARGETS_KEY}: {targets_message(missing, names)}")
    config = PeftLoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules),
        modules_to_save=list(modules_to_save) or None, task_type=task_type,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def is_lora_model(model: torch.nn.Module) -> bool:
    """Answered from `sys.modules`, like `trainer.sharding.is_sharded`: nothing is a
    PEFT model before peft is imported, and asking must not import it."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def lora_scaling(model: torch.nn.Module) -> float:
    """alpha / r, the factor on B @ A (every adapter of a model has the same r)."""
    config = model.peft_config[ADAPTER]
    return config.lora_alpha / config.r


def base_name(peft_name: str) -> str | None:
    """The name a plain model of the base family gives a PEFT model's weight, or None
    for a weight it does not have (an adapter, the frozen original of a
    `modules_to_save` head)."""
    name = peft_name.removeprefix(PEFT_PREFIX)
    if ".lora_" in name or ".original_module." in name:
        return None
    return name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")


def merged_weights(named: Iterable[tuple[str, torch.Tensor]], scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, full tensor) in state-dict order -> (base name, weight) with every
    adapted weight merged: W + (B @ A) * scaling, computed in float32 and cast back.

    A layer's base weight is held until its `lora_A` and `lora_B` have arrived (they
    follow it in state-dict order), so at most one layer is pending. Every rank of a
    sharded model merges, whether it keeps the result or not: the arithmetic is small
    next to the gather, and one path is simpler to keep right.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        layer, _, part = name.partition(".base_layer.")
        if part == "weight":
            pending[layer] = {"weight": tensor}
            continue
        for kind in ("lora_A", "lora_B"):
            marker = f".{kind}.{ADAPTER}."
            if marker in name:
                layer = name.split(marker)[0]
                pending[layer][kind] = tensor
                break
        else:
            renamed = base_name(name)
            if renamed is not None:
                yield renamed, tensor
            continue
        parts = pending[layer]
        if "lora_A" in parts and "lora_B" in parts:
            del pending[layer]
            weight = parts["weight"]
            delta = (parts["lora_B"].float() @ parts["lora_A"].float()) * scaling
            yield base_name(f"{layer}.base_layer.weight"), (weight.float() + delta).to(weight.dtype)
    if pending:
        raise ValueError(f"adapted layers without both lora_A and lora_B: {sorted(pending)[:3]}")


def adapter_config_json(model: torch.nn.Module) -> bytes:
    """PEFT's `adapter_config.json` for this model's adapter, written by PEFT itself
    (it records the base model's path, which the export loads the base from)."""
    with tempfile.TemporaryDirectory() as staging:
        model.peft_config[ADAPTER].save_pretrained(staging)
        with open(os.path.join(staging, ADAPTER_CONFIG_FILE)) as handle:
            config = json.load(handle)
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])  # PEFT keeps a set: same bytes every run
    return json.dumps(config, indent=2, sort_keys=True).encode()


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
