"""What a Hugging Face model folder must hold for a run, read from its files alone.

Every role loads `model.path` with transformers, but importing transformers (and torch
under it) costs seconds and a folder's mistakes surface there as unrelated errors: a
folder without tokenizer files loads as an empty tokenizer of size 1 (transformers
5.19), a tokenizer without a chat template fails the first rollout. So the pre-flight
reads the files themselves with `tokenizers` (a fraction of a second) and names the
folder, what is missing and the fix, before Ray starts (S-BYO-2).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Files from which transformers builds a tokenizer; none of them means no tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "vocab.txt", "tokenizer_config.json",
)
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)
# Architecture names AutoModelForCausalLM (or, for a vision-language model, the
# image-text-to-text auto class) loads: GPT-2's `GPT2LMHeadModel`, Llama's `LlamaForCausalLM`.
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
# model_type values of config.json with a built-in vision packer (data/vision_packer.py).
QWEN_VL_MODEL_TYPES = frozenset({"qwen2_5_vl"})
SAVE_FIX = "save it into the folder with tokenizer.save_pretrained(folder)"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # `owner/name`, as `from_pretrained` takes it


@dataclass(frozen=True)
class TokenizerFacts:
    size: int | None  # len(tokenizer): vocabulary plus added tokens; None when not readable without transformers
    chat_template: str | None  # the file that holds the template, None without one
    eos_token: str | None
    pad_token: str | None


@dataclass
class FolderCheck:
    """Problems as (key, message) pairs, the dotted key first, like every pre-flight check."""

    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tokenizer: TokenizerFacts | None = None

    def problem(self, message: str) -> None:
        self.problems.append(("model.path", message))


def config_value(model_config: dict[str, Any], *names: str) -> Any:
    """The first of `names` the config sets, at its top or in a VLM's `text_config`;
    None when it sets none (architectures name the same size differently)."""
    for section in (model_config, model_config.get("text_config") or {}):
        for name in names:
            if section.get(name) is not None:
                return section[name]
    return None


HEADS = ("num_attention_heads", "n_head", "num_heads")
KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads")
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx")


def model_sizes(model_config: dict[str, Any]) -> str:
    """Layers, hidden size and heads under whichever names the config uses (Llama/Qwen's
    `num_hidden_layers`, GPT-2's `n_layer`, a VLM's `text_config`)."""
    layers = config_value(model_config, "num_hidden_layers", "n_layer", "num_layers")
    hidden = config_value(model_config, "hidden_size", "n_embd", "d_model")
    heads = config_value(model_config, *HEADS)
    kv_heads = config_value(model_config, *KV_HEADS) or heads
    shown = ["?" if value is None else value for value in (layers, hidden, heads, kv_heads)]
    return f"{shown[0]} layers, hidden {shown[1]}, heads {shown[2]}/{shown[3]}"


def cached_hub_file(repo_id: str, filename: str, revision: str | None = None) -> str | None:
    """The path of `filename` of a hub model in the local Hugging Face cache, or None:
    the cache only, never the network (a pre-flight downloads nothing)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except Exception:
        return None
    return found if isinstance(found, str) else None


def check_model_folder(folder: Path, model_config: dict[str, Any]) -> FolderCheck:
    """Weights, architecture and tokenizer of a local model folder whose config.json
    was read into `model_config`."""
    check = FolderCheck()
    _check_architecture(folder, model_config, check)
    if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
        check.problem(
            f"{folder} has no weights ({', '.join(WEIGHT_FILES[:3])}); save the model into it with "
            "model.save_pretrained(folder)"
        )
    present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        check.problem(
            f"{folder} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); transformers would build an "
            f"empty tokenizer for it; {SAVE_FIX}"
        )
        return check
    facts = _read_tokenizer(folder, check)
    if facts is None:
        return check
    check.tokenizer = facts
    rows = config_value(model_config, "vocab_size")  # the input embedding's rows
    if isinstance(rows, int) and facts.size is not None and facts.size > rows:
        check.problem(
            f"{folder}: the tokenizer has {facts.size} tokens but the model's embedding has {rows} rows (config.json "
            f"vocab_size); ids from {rows} up would index past it: model.resize_token_embeddings(len(tokenizer)) and "
            "save the model, or use the tokenizer it was trained with"
        )
    if facts.eos_token is None and facts.pad_token is None:
        check.problem(
            f"{folder}: the tokenizer defines neither eos_token nor pad_token, so prompts cannot be padded into a "
            "batch and completions never end; set tokenizer.eos_token (e.g. '<|endoftext|>') and "
            "tokenizer.save_pretrained(folder)"
        )
    elif facts.eos_token is None:
        check.notes.append("model.path: the tokenizer has no eos_token: completions run to rl.rollout.max_new_tokens")
    elif facts.pad_token is None:
        check.notes.append(
            f"model.path: the tokenizer has no pad_token: its eos_token {facts.eos_token!r} pads prompts (fallback)"
        )
    return check


def _check_architecture(folder: Path, model_config: dict[str, Any], check: FolderCheck) -> None:
    architectures = [name for name in model_config.get("architectures") or [] if isinstance(name, str)]
    if not architectures:
        check.notes.append(
            f"model.path: {folder}/config.json names no architectures; AutoModelForCausalLM picks one from "
            f"model_type {model_config.get('model_type')!r} at load"
        )
    elif not any(name.endswith(CAUSAL_SUFFIXES) for name in architectures):
        check.problem(
            f"{folder} holds a {', '.join(architectures)}, which is not a causal language model (the policy and "
            "the rollout generate text: a *ForCausalLM or *LMHeadModel); point model.path at a generative model"
        )


def _read_tokenizer(folder: Path, check: FolderCheck) -> TokenizerFacts | None:
    settings = _json_file(folder / "tokenizer_config.json", check) or {}
    special = _json_file(folder / "special_tokens_map.json", check) or {}
    size = _tokenizer_size(folder, settings, check)
    if size is False:
        return None
    return TokenizerFacts(
        size=size if isinstance(size, int) else None,
        chat_template=_chat_template_source(folder, settings),
        eos_token=_token(settings.get("eos_token")) or _token(special.get("eos_token")),
        pad_token=_token(settings.get("pad_token")) or _token(special.get("pad_token")),
    )


def _tokenizer_size(folder: Path, settings: dict[str, Any], check: FolderCheck) -> int | None | bool:
    """len(tokenizer), None when only a sentencepiece model is there, False (with a
    problem recorded) when the files do not load."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import ByteLevelBPETokenizer

    try:
        if (folder / "tokenizer.json").is_file():
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            tokenizer = ByteLevelBPETokenizer.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
            added = [token for token in settings.get("added_tokens_decoder", {}).values() if isinstance(token, dict)]
            tokenizer.add_special_tokens([token["content"] for token in added if "content" in token])
        elif (folder / "tokenizer.model").is_file() or (folder / "vocab.txt").is_file():
            return None  # sentencepiece or WordPiece: transformers reads it; its size is checked at load
        else:
            check.problem(
                f"{folder} has tokenizer_config.json but no vocabulary (tokenizer.json, or vocab.json with "
                f"merges.txt); {SAVE_FIX}"
            )
            return False
    except Exception as error:  # a damaged file: whatever `tokenizers` says about it
        check.problem(f"{folder}: the tokenizer does not load ({type(error).__name__}: {error}); {SAVE_FIX}")
        return False
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size <= 1:
        check.problem(f"{folder}: the tokenizer has {size} token(s), an empty vocabulary; {SAVE_FIX}")
        return False
    return size


def _chat_template_source(folder: Path, settings: dict[str, Any]) -> str | None:
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).is_file():
            return name
    return "tokenizer_config.json" if settings.get("chat_template") else None


def _token(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _json_file(path: Path, check: FolderCheck) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        check.problem(f"cannot read {path}: {error}; {SAVE_FIX}")
        return None
    return value if isinstance(value, dict) else None
