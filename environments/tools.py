"""Tools from plain Python functions, and the environment most tool tasks need.

A function with type hints and a Google-style docstring is a tool: its JSON schema (what
the chat template shows the model) comes from `transformers.utils.get_json_schema`, so it
is the schema Hugging Face templates are written for. Whatever the model does wrong when
calling it (an unknown name, bad arguments, a call that raises) comes back as a tool
message starting `error:`, which the model can learn from; it never stops the run.
"""

from __future__ import annotations

import copy
import inspect
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from transformers.utils import DocstringParsingException, TypeHintParsingException, get_json_schema

from environments.protocol import EnvRow, Reset, Step
from environments.tool_calls import ToolCall, tool_calls_of

Function = TypeVar("Function", bound=Callable[..., Any])


class ToolSchemaError(ValueError):
    """A function that cannot be described to the model as a tool."""


@dataclass(frozen=True)
class ToolResult:
    """A call's answer to the model (`{"role": "tool", "name": ..., "content": str}`, with
    `tool_call_id` when the call had an id), and whether it reports an error, so the
    episode can count them. Role `tool` whatever the model family: the episode loop renders
    it in the role of the run's tool-call format (`rl.env.tool_call_format`)."""

    message: dict[str, Any]
    error: bool


class ToolRegistry:
    """The tools of an environment, by name, in the order they were added.

    Schemas are made when a function is added, so a function that cannot be a tool fails
    where it is defined, not in the middle of an episode."""

    def __init__(self, functions: Iterable[Callable[..., Any]] = ()) -> None:
        self._functions: dict[str, Callable[..., Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        for function in functions:
            self.add(function)

    def add(self, function: Function) -> Function:
        """Adds `function` as a tool named after it; returns it, so it also works as
        `@registry.add`."""
        label = getattr(function, "__qualname__", None) or repr(function)
        try:
            schema = get_json_schema(function)
        except (DocstringParsingException, TypeHintParsingException) as error:
            raise ToolSchemaError(
                f"tool {label}: {error} (a tool needs a type hint on every argument and a Google-style "
                "docstring describing each one under 'Args:')"
            ) from error
        name = schema["function"]["name"]
        if name in self._functions:
            raise ToolSchemaError(f"tool {label}: a tool named {name!r} is already in this registry")
        self._functions[name] = function
        self._schemas[name] = schema
        return function

    def names(self) -> list[str]:
        return list(self._functions)

    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, as chat templates take them in `tools=` (copies: a
        caller that edits them does not change the registry)."""
        return copy.deepcopy(list(self._schemas.values()))

    def call(self, call: ToolCall) -> ToolResult:
        """Runs one call; any failure becomes an `error:` message naming what to fix."""
        function = self._functions.get(call.name)
        if function is None:
            tools = ", ".join(self._functions) or "(none)"
            return _tool_error(call, f"there is no tool named {call.name!r}; the tools are: {tools}")
        try:
            inspect.signature(function).bind(**call.arguments)
        except TypeError as error:
            given = json.dumps(call.arguments, ensure_ascii=False)
            return _tool_error(call, f"{self._usage(call.name)} cannot take arguments {given}: {error}")
        try:
            result = function(**call.arguments)
        except Exception as error:  # the model's call failed, not the run: it is told why
            return _tool_error(call, f"{call.name} raised {type(error).__name__}: {error}")
        return _tool_result(call, _render(result), error=False)

    def _usage(self, name: str) -> str:
        """`lookup(key: string, limit?: integer)`: the call as the model sees it in the schema."""
        parameters = self._schemas[name]["function"]["parameters"]
        required = set(parameters.get("required", ()))
        return f"{name}(" + ", ".join(
            f"{parameter}{'' if parameter in required else '?'}: {schema.get('type', 'any')}"
            for parameter, schema in parameters["properties"].items()
        ) + ")"


def _tool_result(call: ToolCall, content: str, error: bool) -> ToolResult:
    message = {"role": "tool", "name": call.name, "content": content}
    if call.id is not None:  # a format whose answers name their call (Mistral's): this one's id
        message["tool_call_id"] = call.id
    return ToolResult(message, error)


def _tool_error(call: ToolCall, what_went_wrong: str) -> ToolResult:
    return _tool_result(call, f"error: {what_went_wrong}", error=True)


def _render(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


class ToolEnvironment(ABC):
    """An environment (environments.protocol.Environment) where the model calls tools
    until it answers without calling one, and that answer alone earns the reward.

    A subclass sets `tools` (on the class, or on the instance in `opening`, for tools bound
    to the episode's row) and writes `opening` and `answer`. `tool_errors` counts the calls
    that came back as errors this episode, for the episode loop to report."""

    tools: ToolRegistry
    tool_errors: int = 0

    @abstractmethod
    def opening(self, row: EnvRow, seed: int) -> list[dict[str, Any]]:
        """The messages the model sees first."""

    @abstractmethod
    def answer(self, content: str) -> float:
        """The reward of the final answer (the assistant's text outside tool calls)."""

    def reset(self, row: EnvRow, seed: int) -> Reset:
        messages = self.opening(row, seed)  # first: it may set the episode's tools
        return Reset(messages, self._registry().schemas())

    def step(self, assistant_message: dict[str, Any]) -> Step:
        calls = tool_calls_of(assistant_message)
        if not calls:
            return Step([], self.answer(assistant_message["content"]), True)
        results = [self._registry().call(call) for call in calls]
        self.tool_errors += sum(result.error for result in results)
        return Step([result.message for result in results], 0.0, False)

    def _registry(self) -> ToolRegistry:
        tools = getattr(self, "tools", None)
        if not isinstance(tools, ToolRegistry):
            raise TypeError(
                f"{type(self).__name__}.tools is {type(tools).__name__}, not a ToolRegistry: set "
                "`tools = ToolRegistry([...])` on the class, or on self in opening()"
            )
        return tools
