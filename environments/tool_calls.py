"""Tool calls: reading them out of a model's text in Qwen3's `<tool_call>` blocks (the
`qwen3` entry of environments/tool_call_formats.py, which holds the other families'
formats), and carrying them in the Hugging Face chat-template message format.

A policy in training writes broken calls often, so a block that does not parse is an
error in the `ParsedTurn` (the episode loop reports it, and the model may see it), never
an exception that ends the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
QUOTE_LIMIT = 80  # characters of a bad block quoted in its error: enough to recognise it

# A block runs from an opening tag to its closing tag; one that meets another opening tag
# or the end of the text first is unclosed (the `close` group is then empty).
_BLOCK = re.compile(
    rf"{re.escape(TOOL_CALL_OPEN)}(?P<body>.*?)(?P<close>{re.escape(TOOL_CALL_CLOSE)}|(?={re.escape(TOOL_CALL_OPEN)})|\Z)",
    re.DOTALL,
)


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: a tool's name, the keyword arguments to call it with,
    and the id the model gave it (formats that write ids: Mistral's; None otherwise)."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn read once: its text outside tool-call blocks (stripped), the calls
    that parsed, and one error per block that did not (in the order they appear)."""

    content: str
    tool_calls: list[ToolCall]
    errors: list[str]


def parse_tool_calls(text: str) -> ParsedTurn:
    """The calls in `text`, written as Qwen3 writes them, one JSON object per block:

        <tool_call>
        {"name": "lookup", "arguments": {"key": "a"}}
        </tool_call>

    Whitespace around the JSON does not matter. `arguments` may also be a JSON string that
    holds an object (some models write it so), or absent when the tool takes none."""
    outside: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    position = 0
    for number, block in enumerate(_BLOCK.finditer(text), start=1):
        outside.append(text[position:block.start()])
        position = block.end()
        body = block.group("body")
        if not block.group("close"):
            errors.append(f"tool call {number}: {TOOL_CALL_OPEN} has no closing {TOOL_CALL_CLOSE}: {quote(body)}")
            continue
        call_or_error = _read_call(body)
        if isinstance(call_or_error, ToolCall):
            calls.append(call_or_error)
        else:
            errors.append(f"tool call {number}: {call_or_error}: {quote(body)}")
    outside.append(text[position:])
    if any(TOOL_CALL_CLOSE in part for part in outside):
        # A call whose opening tag is missing would otherwise vanish into the content unseen.
        errors.append(f"a {TOOL_CALL_CLOSE} has no opening {TOOL_CALL_OPEN} before it")
    return ParsedTurn("".join(outside).strip(), calls, errors)


def _read_call(body: str) -> ToolCall | str:
    """The call a block's body holds, or what is wrong with it."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        return f"the JSON does not parse ({error})"
    return call_from_json(value)


def call_from_json(value: Any, arguments_keys: tuple[str, ...] = ("arguments",)) -> ToolCall | str:
    """The call a decoded JSON value holds, or what is wrong with it. The arguments are
    read from the first of `arguments_keys` the object has (Llama writes "parameters");
    they may also be a JSON string that holds an object, or absent when the tool takes none."""
    key = next((k for k in arguments_keys if isinstance(value, dict) and k in value), arguments_keys[0])
    if not isinstance(value, dict):
        return f'expected a JSON object {{"name": ..., "{key}": {{...}}}}, got a JSON {json_type(value)}'
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return f'"name" must be a non-empty string naming the tool, got {json.dumps(name)}'
    arguments = value.get(key, {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f'"{key}" of {name!r} is a string that is not JSON; it must be an object of argument values'
    if not isinstance(arguments, dict):
        return f'"{key}" of {name!r} must be a JSON object of argument values, got a JSON {json_type(arguments)}'
    return ToolCall(name, arguments)


def json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def quote(body: str) -> str:
    """A bad block as its error quotes it: stripped, cut at QUOTE_LIMIT characters."""
    body = body.strip()
    return repr(body if len(body) <= QUOTE_LIMIT else body[:QUOTE_LIMIT - 3] + "...")


def assistant_message(parsed: ParsedTurn) -> dict[str, Any]:
    """The message an environment's `step` receives, in the format Hugging Face chat
    templates take (so the same message renders back into the conversation):
    `{"role": "assistant", "content": ..., "tool_calls": [{"type": "function", "function":
    {"name": ..., "arguments": {...}}}]}`, with `tool_calls` only when there are calls, and
    an entry's `id` only when the model wrote one."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [_entry(call) for call in parsed.tool_calls]
    return message


def _entry(call: ToolCall) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "function", "function": {"name": call.name, "arguments": dict(call.arguments)}}
    if call.id is not None:
        entry["id"] = call.id
    return entry


def tool_calls_of(message: dict[str, Any]) -> list[ToolCall]:
    """The calls an assistant message carries (none when it has no `tool_calls`).

    Reads the Hugging Face format `assistant_message` writes, and also the entries
    templates accept besides it: no `function` wrapper, or `arguments` as a JSON string
    (the OpenAI API's form). A malformed message is a bug upstream, so it raises."""
    calls = []
    for index, entry in enumerate(message.get("tool_calls") or []):
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", {}) if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise ValueError(
                f"message tool_calls[{index}] is not a tool call: expected "
                f'{{"type": "function", "function": {{"name": str, "arguments": dict}}}}, got {entry!r}'
            )
        call_id = entry.get("id") if isinstance(entry.get("id"), str) else None
        calls.append(ToolCall(name, arguments, call_id))
    return calls
