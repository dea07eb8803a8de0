"""What a reward model folder must hold, read from its files alone (no torch, no
transformers), so the pre-flight refuses a wrong folder in a fraction of a second
naming `rl.reward.model.*` (S-BYO-2, S-RM-1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from configs.schema import RewardModelConfig
from files.model_folder import HUB_ID, POSITIONS, TOKENIZER_FILES, WEIGHT_FILES, config_value

KEY = "rl.reward.model.path"


def label_count(model_config: dict[str, Any]) -> int:
    """transformers' `num_labels`: the length of id2label where written, else num_labels (default 2)."""
    id2label = model_config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    value = model_config.get("num_labels")
    return value if isinstance(value, int) else 2


def reward_model_folder_problems(settings: RewardModelConfig) -> tuple[list[tuple[str, str]], str | None]:
    """(key, message) problems of the local folder at `rl.reward.model.path`, and a
    summary line for the manifest (None when there is nothing to say)."""
    if settings.path is None:
        return [], None
    folder = Path(settings.path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        if settings.tiny is None and HUB_ID.match(settings.path) and not folder.exists():
            at = f" at revision {settings.revision}" if settings.revision else " (default branch)"
            return [], (f"reward model: {settings.path} (hub id{at}; pinned to a commit at launch, its folder "
                        "checked by the reward role when it loads)")
        if settings.tiny is not None:
            return [], (f"reward model: {folder} does not exist yet; the tiny reward model is built and trained there "
                        f"at start-up ({settings.tiny.train_steps} steps on {settings.tiny.task} preference pairs)")
        return [(KEY, f"{settings.path!r} has no config.json (expected a Hugging Face sequence-classification "
                      "model folder)")], None
    try:
        model_config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [(KEY, f"cannot read {config_file}: {error}")], None
    problems: list[tuple[str, str]] = []
    architectures = [a for a in model_config.get("architectures") or [] if isinstance(a, str)]
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        problems.append((KEY, f"{folder} holds a {', '.join(architectures) or model_config.get('model_type')}, not a "
                              "sequence classifier; a reward model is saved by AutoModelForSequenceClassification with "
                              "num_labels=1 (TRL's and OpenRLHF's reward trainers write one)"))
    elif label_count(model_config) != 1:
        problems.append((KEY, f"{folder} is a sequence classifier with {label_count(model_config)} labels; a reward "
                              "model has one (its logit is the score)"))
    if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
        problems.append((KEY, f"{folder} has no weights; save the model into it with model.save_pretrained(folder)"))
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append((KEY, f"{folder} has no tokenizer files: the reward model scores text in its own tokens; "
                              "save its tokenizer there with tokenizer.save_pretrained(folder)"))
    positions = config_value(model_config, *POSITIONS)
    if isinstance(positions, int) and settings.max_length > positions:
        problems.append(("rl.reward.model.max_length",
                         f"is {settings.max_length}, over the reward model's context of {positions} positions "
                         f"({config_file})"))
    weights = sum(path.stat().st_size for path in folder.glob("*.safetensors")) + sum(
        path.stat().st_size for path in folder.glob("pytorch_model*.bin"))
    summary = (f"reward model: {folder} ({', '.join(architectures) or '?'}; {weights / 2**20:.1f} MiB of weights, "
               f"held for the whole run), combine={settings.combine} ({describe_shaping(settings)})")
    return problems, summary


def describe_shaping(settings: RewardModelConfig) -> str:
    parts = ["normalised (running)" if settings.normalize else "raw scores"]
    if settings.clip is not None:
        parts.append(f"clipped to ±{settings.clip}")
    if settings.missing_eos_penalty is not None:
        parts.append(f"missing-EOS penalty {settings.missing_eos_penalty}")
    if settings.weight != 1.0:
        parts.append(f"weight {settings.weight}")
    return ", ".join(parts)
