"""Launch checks of a multi-turn run that read the model folder (S-ENV-1, S-BYO-5): its
chat template must render the tool messages an environment answers with, in the role
the run's tool-call format gives them, the model must be a text model, and an episode
must fit the model's positions. Run before any worker starts, so a template that would
drop every observation is refused by key instead of training on episodes without them.
A user's environment is never called here (S-SEC-3: the pre-flight runs no user code in
the driver); one of the project's own modules is, to measure its openings."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Sequence

from configs.schema import EnvConfig, PPOConfig
from environments.chat_tokens import ObservationEncoder, TemplateError
from configs.tool_call_format_names import DEFAULT_FORMAT
from environments.tool_call_formats import ToolCallFormat, format_named, role_hint

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
    try:
        template_renders_tool_messages(_tokenizer(str(folder)), format_named(config.rl.env.tool_call_format))
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


@functools.lru_cache(maxsize=2)
def _tokenizer(folder: str):
    """The policy's tokenizer, loaded once for the template check and the openings."""
    from data.packing import load_chat_tokenizer  # transformers, only for a multi-turn run

    return load_chat_tokenizer(folder)


def opening_too_long(
    row: str, factory: str, opening: int, budget: int, positions: int, max_turn_tokens: int
) -> str:
    """S-BYO-5: one wording for an opening that leaves too few positions, whether the
    pre-flight measured it or the first episode did. `row`: which row, and where from."""
    return (
        f"the opening of the episode of {row}, from environment {factory} (rl.env.factory), is {opening} tokens "
        f"(its messages and tools' schemas through the chat template); with rl.env.max_episode_tokens={budget} that "
        f"is {opening + budget} positions, beyond the model's context of {positions} (config.json): lower "
        f"rl.env.max_episode_tokens to at most {max(positions - opening, 0)} (and rl.env.max_turn_tokens="
        f"{max_turn_tokens} with it), or shorten the opening or its tools"
    )


OPENING_ROWS = 16  # rows whose openings the pre-flight measures (a file's first ones, a factory's row 0)


def measured_openings(
    config: PPOConfig, rows: Sequence[tuple[dict[str, Any], str]], positions: int
) -> tuple[list[tuple[str, str]], str]:
    """S-BYO-5: the openings of the first rows' episodes, measured as the rollout role will
    (the environment's reset, its messages and tools through the chat template), against
    the model's `positions` with rl.env.max_episode_tokens. Only for an environment of
    the project's own modules: the caller checks that. Returns problems and a summary line."""
    from configs.callables import import_callable
    from data.prompt_projection import project_prompt, project_reference, reference_key_for
    from environments.chat_tokens import opening_ids
    from environments.protocol import EnvRow, checked_reset

    env, data = config.rl.env, config.rl.data
    assert env is not None
    build = import_callable(env.factory, key="rl.env.factory", trusted=config.job.trusted_modules)
    tokenizer = _tokenizer(str(Path(config.model.path)))
    longest, longest_where = 0, ""
    for row_id, (value, where) in enumerate(rows[:OPENING_ROWS]):
        row = EnvRow(
            project_prompt(value, prompt_key=data.prompt_key, where=where),
            project_reference(value, reference_key=reference_key_for(value, data.reference_key, required=False),
                              where=where),
            {k: v for k, v in value.items() if k not in (data.prompt_key, data.reference_key)}, row_id, where,
        )
        try:
            reset = checked_reset(build(**env.factory_kwargs).reset(row, config.job.seed))
            opening = len(opening_ids(tokenizer, reset.messages, reset.tools))
        except Exception as error:  # the project's own environment: its refusal is the run's
            return [("rl.env.factory", f"{env.factory}: the episode of {where} does not open: "
                     f"{type(error).__name__}: {error}")], ""
        if opening > longest:
            longest, longest_where = opening, where
        if opening + env.max_episode_tokens > positions:
            return [("rl.env.max_episode_tokens", opening_too_long(
                f"row {row_id} ({where})", env.factory, opening, env.max_episode_tokens, positions,
                env.max_turn_tokens,
            ))], ""
    measured = min(len(rows), OPENING_ROWS)
    return [], (
        f"episode openings: the longest of {measured} measured is {longest} tokens ({longest_where}); with "
        f"rl.env.max_episode_tokens={env.max_episode_tokens}, {longest + env.max_episode_tokens} of the model's "
        f"{positions} positions"
    )


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
