"""The shapes of a model's weights, read without loading them, for the manifest's memory
estimate (placement/memory_estimate.py).

A local safetensors checkpoint gives exact shapes from its JSON headers (a few KiB per
file; no tensor is read). Without one, as when a hub model's cache holds only its
config.json, a Llama/Qwen-style decoder's shapes are derived from config.json (norms
counted, biases not). Anything else, a hub id that is not in the local cache among them,
is unknown, with the reason. Imports neither torch nor transformers; never downloads.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from files.model_folder import HEADS, HUB_ID, KV_HEADS, cached_hub_file, config_value

Shapes = dict[str, tuple[int, ...]]
HIDDEN = ("hidden_size", "n_embd", "d_model")


@dataclass(frozen=True)
class WeightShapes:
    """Tensor name -> shape of one model, or None with `source` saying why not."""

    shapes: Shapes | None
    source: str  # where the shapes come from, or why they are unknown
    hidden_size: int | None = None

    @property
    def parameters(self) -> int | None:
        if self.shapes is None:
            return None
        return sum(math.prod(shape) for shape in self.shapes.values())


def safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (8-byte little-endian length, then JSON):
    name -> {"dtype", "shape", "data_offsets"}, without `__metadata__`."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def checkpoint_weight_names(folder: Path) -> list[str] | None:
    """Tensor names of a local safetensors checkpoint (its index's weight map, else its
    one file's header); None without one, or when it cannot be read (the loader's to
    report, with its own message)."""
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            return list(json.loads(index.read_text())["weight_map"])
        if (folder / "model.safetensors").is_file():
            return list(safetensors_header(folder / "model.safetensors"))
    except (OSError, ValueError, KeyError, struct.error):
        pass
    return None


def checkpoint_shapes(folder: Path) -> Shapes | None:
    """Shapes from `model.safetensors` or the shards its index names; None without one."""
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (folder / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            return None
        shapes: Shapes = {}
        for name in files:
            header = safetensors_header(folder / name)
            shapes.update({tensor: tuple(entry["shape"]) for tensor, entry in header.items()})
        return shapes
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None  # a shard not downloaded, a damaged header: the loader reports those


def decoder_shapes(model_config: dict[str, Any]) -> Shapes | None:
    """A Llama/Qwen-style decoder's weight shapes from its config.json (gated MLP,
    grouped-query attention; a sequence classifier's `score` instead of `lm_head`), or
    None when the config does not give those sizes (GPT-2's, a vision tower's)."""
    vocab, hidden, layers, inner = (config_value(model_config, name) for name in (
        "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size"))
    heads = config_value(model_config, *HEADS)
    kv_heads = config_value(model_config, *KV_HEADS) or heads
    sizes = (vocab, hidden, layers, inner, heads, kv_heads)
    if model_config.get("vision_config") is not None or not all(isinstance(v, int) and v > 0 for v in sizes):
        return None
    head_dim = config_value(model_config, "head_dim") or hidden // heads
    shapes: Shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        shapes.update({
            f"{prefix}.self_attn.q_proj.weight": (heads * head_dim, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, heads * head_dim),
            f"{prefix}.mlp.gate_proj.weight": (inner, hidden),
            f"{prefix}.mlp.up_proj.weight": (inner, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, inner),
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
        })
    architectures = [a for a in model_config.get("architectures") or [] if isinstance(a, str)]
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        shapes["score.weight"] = (1, hidden)
    elif not model_config.get("tie_word_embeddings", True):  # transformers' default ties them
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def read_weight_shapes(path: str, revision: str | None = None) -> WeightShapes:
    """The shapes of the model `from_pretrained(path)` would load: a local folder, or a
    hub id's snapshot in the local Hugging Face cache."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        if not (HUB_ID.match(path) and not folder.exists()):
            return WeightShapes(None, f"{path} has no config.json")
        cached = cached_hub_file(path, "config.json", revision)
        if cached is None:
            return WeightShapes(None, f"{path} is a hub id that is not in the local Hugging Face cache; "
                                      "nothing was downloaded")
        folder = Path(cached).parent
    try:
        model_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return WeightShapes(None, f"cannot read {folder}/config.json: {error}")
    hidden = config_value(model_config, *HIDDEN)
    hidden = hidden if isinstance(hidden, int) else None
    shapes = checkpoint_shapes(folder)
    if shapes is not None:
        return WeightShapes(shapes, "safetensors headers", hidden)
    shapes = decoder_shapes(model_config)
    if shapes is not None:
        return WeightShapes(shapes, "config.json sizes, biases not counted", hidden)
    return WeightShapes(None, f"{folder} has no safetensors checkpoint and config.json does not give a "
                              "Llama-style decoder's sizes", hidden)
