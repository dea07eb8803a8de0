"""What an environment is (S-ENV-1), and the checks that turn a malformed answer from
user code into an error naming the environment, the row and the turn.

An environment object lives for one episode: `rl.env.factory(**rl.env.factory_kwargs)`
is called once per row and sample, then `reset` once and `step` once per assistant turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class EnvRow:
    """The data row an episode starts from, as the data role projected it."""

    prompt: Any                    # a string or a conversation (S-DATA-2)
    reference: str | None
    metadata: dict[str, Any]
    row_id: int
    source: str = ""               # where the row came from, for error messages


@dataclass(frozen=True)
class Reset:
    """The opening of an episode: the messages the model sees first, and the tools it
    may call (JSON schemas as chat templates take them in `tools=`)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Step:
    """What one assistant turn earned: the observation messages (tool results, a user
    reply; empty when the episode ends), the turn's reward, and whether it ended."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: EnvRow, seed: int) -> Reset: ...

    def step(self, assistant_message: dict[str, Any]) -> Step: ...


class MalformedEnvironmentOutput(ValueError):
    """An environment returned something the episode loop cannot use."""


def check_messages(messages: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise MalformedEnvironmentOutput(f"{what}: messages must be a list of dicts, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise MalformedEnvironmentOutput(
                f"{what}: message {index} must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise MalformedEnvironmentOutput(
                f"{what}: message {index} has role {role!r}; accepted roles: {', '.join(MESSAGE_ROLES)}"
            )
        if not isinstance(message.get("content"), str):
            raise MalformedEnvironmentOutput(
                f"{what}: message {index} ({role}) needs a string 'content', got "
                f"{type(message.get('content')).__name__}"
            )
    return messages


def checked_reset(value: Any) -> Reset:
    """A `Reset`, or the shorthands a user may return: a list of messages, or
    `(messages, tools)`."""
    if isinstance(value, Reset):
        reset = value
    elif isinstance(value, list):
        reset = Reset(value)
    elif isinstance(value, tuple) and len(value) == 2:
        reset = Reset(value[0], value[1])
    else:
        raise MalformedEnvironmentOutput(
            f"reset returned {type(value).__name__}; return environments.protocol.Reset(messages, tools), a list "
            "of messages, or (messages, tools)"
        )
    messages = check_messages(reset.messages, "reset")
    if not messages:
        raise MalformedEnvironmentOutput("reset returned no messages: the model needs an opening to answer")
    if reset.tools is not None and not (
        isinstance(reset.tools, list) and all(isinstance(tool, dict) for tool in reset.tools)
    ):
        raise MalformedEnvironmentOutput("reset: tools must be a list of JSON-schema dicts or None")
    return reset


def checked_step(value: Any) -> Step:
    """A `Step`, or the shorthand `(messages, reward, done)`."""
    if isinstance(value, Step):
        step = value
    elif isinstance(value, tuple) and len(value) == 3:
        step = Step(*value)
    else:
        raise MalformedEnvironmentOutput(
            f"step returned {type(value).__name__}; return environments.protocol.Step(messages, reward, done) or "
            "(messages, reward, done)"
        )
    check_messages(step.messages, "step")
    if any(message["role"] == "assistant" for message in step.messages):
        raise MalformedEnvironmentOutput("step: an observation may not speak as the assistant (role 'assistant')")
    if isinstance(step.reward, bool) or not isinstance(step.reward, (int, float)) or not math.isfinite(step.reward):
        raise MalformedEnvironmentOutput(f"step: reward must be a finite number, got {step.reward!r}")
    if not isinstance(step.done, bool):
        raise MalformedEnvironmentOutput(f"step: done must be True or False, got {step.done!r}")
    if not step.done and not step.messages:
        raise MalformedEnvironmentOutput("step: an episode that goes on (done=False) needs observation messages")
    return Step(list(step.messages), float(step.reward), step.done)
