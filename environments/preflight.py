"""Launch checks of a multi-turn run that read the model folder (S-ENV-1): its chat
template must render the tool messages an environment answers with, and the model must
be a text model. Run before any worker starts, so a template that would drop every
observation is refused by key instead of training on episodes without them."""

from __future__ import annotations

import json
from pathlib import Path

from configs.schema import PPOConfig
from environments.chat_tokens import ObservationEncoder, TemplateError

PROBE = "tool-answer-7"


def environment_problems(config: PPOConfig) -> list[tuple[str, str]]:
    """(key, message) pairs; nothing when rl.env is unset or the model is not on disk
    yet (a tiny model built at start-up: its rollout actor makes the same check)."""
    if config.rl.env is None:
        return []
    folder = Path(config.model.path)
    if not (folder / "config.json").is_file():
        return []
    model_config = json.loads((folder / "config.json").read_text())
    if "vision_config" in model_config:
        return [("rl.env", f"multi-turn episodes take text models; {folder} is a vision-language model")]
    from models.model_io import load_tokenizer  # transformers, only for a multi-turn run

    try:
        template_renders_tool_messages(load_tokenizer(str(folder)))
    except ValueError as error:
        return [("rl.env", f"{error} (model {folder})")]
    return []


def template_renders_tool_messages(tokenizer) -> None:
    """Raise TemplateError unless an observation of role `tool` comes out with its text."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TemplateError("the model's tokenizer has no chat template, so an episode's turns cannot be rendered")
    encoder = ObservationEncoder(tokenizer, tokenizer.eos_token)
    if PROBE not in encoder.text([{"role": "tool", "content": PROBE}]):
        raise TemplateError(
            "the model's chat template does not render messages of role 'tool' (a tool's answer would vanish from "
            "the episode); use a model whose template renders tool results, or a tokenizer with such a template"
        )
