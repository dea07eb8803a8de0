"""Launch checks of a multi-turn run that read the model folder (S-ENV-1, S-BYO-5): its
chat template must render the tool messages an environment answers with, in the role
the run's tool-call format gives them, the model must be a text model, and an episode
must fit the model's positions. Run before any worker starts, so a template that would
drop every observation is refused by key instead of training on episodes without them.
Nothing here calls the environment: it is user code (S-SEC-3)."""

from __future__ import annotations

import json
from pathlib import Path

from configs.schema import EnvConfig, PPOConfig
from environments.chat_tokens import ObservationEncoder, TemplateError
from environments.tool_call_formats import DEFAULT_FORMAT, ToolCallFormat, format_named, role_hint

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
        template_renders_tool_messages(load_tokenizer(str(folder)), format_named(config.rl.env.tool_call_format))
    except ValueError as error:
        return [("rl.env", f"{error} (model {folder})")]
    return []


def episode_context_problems(env: EnvConfig, positions: int) -> list[tuple[str, str]]:
    """S-BYO-5: an episode's tokens after its opening cannot reach the model's context
    (`positions`, config.json). The opening itself needs the environment, so the rollout
    role measures it when an episode opens (environments/episodes.py)."""
    if env.max_episode_tokens < positions:
        return []
    return [(
        "rl.env.max_episode_tokens",
        f"is {env.max_episode_tokens}, not below the model's context of {positions} positions (config.json); the "
        f"episode's opening (its messages and tools' schemas) plus its turns and observations must fit: set it below "
        f"{positions} minus the opening's length, with rl.env.max_turn_tokens (now {env.max_turn_tokens}) at most "
        "as large",
    )]


def template_renders_tool_messages(tokenizer, tool_format: ToolCallFormat | None = None) -> None:
    """Raise TemplateError unless a tool's answer, in the role `tool_format` gives it,
    comes out with its text."""
    tool_format = tool_format or format_named(DEFAULT_FORMAT)
    if getattr(tokenizer, "chat_template", None) is None:
        raise TemplateError("the model's tokenizer has no chat template, so an episode's turns cannot be rendered")
    encoder = ObservationEncoder(tokenizer, tokenizer.eos_token)
    role = tool_format.tool_role
    answer = tool_format.rendered_answers([{"role": "tool", "content": PROBE}], [])
    fix = (
        f"set rl.env.tool_call_format to your model family's format ({role_hint()}), or use a chat template that "
        f"renders role {role!r}"
    )
    try:
        rendered = encoder.text(answer)
    except TemplateError as error:
        raise TemplateError(
            f"the model's chat template cannot render a tool's answer in role {role!r} "
            f"(rl.env.tool_call_format={tool_format.name}): {error.__cause__ or error}; {fix}"
        ) from error
    if PROBE not in rendered:
        raise TemplateError(
            f"the model's chat template does not render messages of role {role!r} (rl.env.tool_call_format="
            f"{tool_format.name} answers tools in that role; a tool's answer would vanish from the episode); {fix}"
        )
