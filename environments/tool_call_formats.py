"""The tool-call formats model families write, as a registry (S-BYO-5): `rl.env.tool_call_format`.

An entry says how a family's assistant text carries its calls (a parser: text -> the
calls and one error per call that could not be read, never an exception), the role
its chat template gives a tool's answer, and whether the call's marker is a special
token the decode must keep. Environments always answer in role `tool`
(environments/protocol.py); the episode loop renders those answers in the format's
role. Adding a format is one function under `@tool_call_format(...)`, whose entry also
writes its row of docs/howto/environments.md's table
(`python -m environments.tool_call_formats`), and its name in
configs/tool_call_format_names.py, where the config (a room below) reads the names; this
module refuses to import when the two lists differ.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from configs.tool_call_format_names import FORMAT_NAMES, known_format
from environments.tool_calls import ParsedTurn, ToolCall, call_from_json, json_type, parse_tool_calls, quote

Parser = Callable[[str], ParsedTurn]


@dataclass(frozen=True)
class ToolCallFormat:
    """One registry entry. `tool_role`: the role a tool's answer is rendered in.
    `reads_special_tokens`: the parser reads the turn decoded with its special tokens
    (the call's marker is one in the family's tokenizer), not the plain text.
    `answers_carry_call_ids`: a tool answer must name the call it answers
    (`tool_call_id`), as the family's template requires. `turn_ends`: tokens besides the
    tokenizer's EOS with which the family's model ends a turn to hear a tool's answer
    (the engine stops there, and the turn is read and answered as after EOS).
    `written_as` and `family`: the docs table's words (markdown)."""

    name: str
    parse: Parser
    tool_role: str
    family: str
    written_as: str
    reads_special_tokens: bool = False
    answers_carry_call_ids: bool = False
    turn_ends: tuple[str, ...] = ()

    def rendered_answers(self, messages: list[dict[str, Any]], calls: list[ToolCall]) -> list[dict[str, Any]]:
        """An environment's observation messages as the template renders them: each
        `tool` message in this format's role and, where the format needs it, naming the
        call it answers (the n-th tool message answers the n-th call; a call without an
        id, or an answer to a turn that could not be read, gets a stable one of its own).
        Other messages are passed as they are."""
        rendered, answered = [], 0
        for message in messages:
            if message.get("role") == "tool":
                message = {**message, "role": self.tool_role}
                if self.answers_carry_call_ids and not message.get("tool_call_id"):
                    call = calls[answered] if answered < len(calls) else None
                    message["tool_call_id"] = call.id if call is not None and call.id else f"{answered + 1:09d}"
                answered += 1
            rendered.append(message)
        return rendered


FORMATS: dict[str, ToolCallFormat] = {}  # name -> entry, in the order the docs list them


def tool_call_format(
    name: str, *, tool_role: str, family: str, written_as: str, reads_special_tokens: bool = False,
    answers_carry_call_ids: bool = False, turn_ends: tuple[str, ...] = (),
) -> Callable[[Parser], Parser]:
    """Registers the decorated parser as the format `name` (`rl.env.tool_call_format=name`)."""

    def register(parse: Parser) -> Parser:
        if name in FORMATS:
            raise ValueError(f"tool-call format {name!r} is registered twice")
        FORMATS[name] = ToolCallFormat(
            name, parse, tool_role, family, written_as, reads_special_tokens, answers_carry_call_ids, turn_ends
        )
        return parse

    return register


def format_named(name: str) -> ToolCallFormat:
    """The entry `name`; an unknown name is refused listing the known ones."""
    return FORMATS[known_format(name)]


def role_hint() -> str:
    """`qwen3` (role 'tool'), ...: which format answers in which role, for fix hints."""
    return ", ".join(f"{entry.name} (role {entry.tool_role!r})" for entry in FORMATS.values())


# --- the formats ---------------------------------------------------------------------


@tool_call_format(
    "qwen3",
    tool_role="tool",
    family="Qwen2.5, Qwen3 and Hermes-style templates (Hermes 2 Pro, Hermes 3)",
    written_as='`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call',
)
def parse_qwen3(text: str) -> ParsedTurn:
    """Qwen3's (and Hermes') `<tool_call>` blocks (environments/tool_calls.py,
    `parse_tool_calls`). Source: Qwen's function-calling guide
    (https://qwen.readthedocs.io/en/latest/framework/function_call.html, "Hermes-style
    tool use") and the template Qwen3's tokenizer ships, which writes each call so."""
    return parse_tool_calls(text)


PYTHON_TAG = "<|python_tag|>"
END_OF_MESSAGE = "<|eom_id|>"


@tool_call_format(
    "llama3_json",
    tool_role="ipython",
    family="Llama 3.1, 3.2 and 3.3 instruct models (JSON tool calling)",
    written_as='`{"name": ..., "parameters": {...}}` as the whole turn, optionally after `<|python_tag|>`, ending '
    'with `<|eot_id|>` or `<|eom_id|>`',
    turn_ends=(END_OF_MESSAGE,),
)
def parse_llama3_json(text: str) -> ParsedTurn:
    """Llama 3.1's JSON tool calls: the assistant's turn is a bare JSON object
    `{"name": ..., "parameters": {...}}`, possibly after `<|python_tag|>`; the tool's
    answer comes back in role `ipython`. Source: Meta's Llama 3.1 prompt format
    (https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_1/, "JSON based
    tool calling" and the `ipython` role, which the Llama 3.2 page keeps for the text
    models), and the template of Meta's Hugging Face repositories, which writes a call
    as `{"name": ..., "parameters": ...}` and renders roles `tool` and `ipython` both
    under an `ipython` header.

    A turn is read as calls when its text (after the tag) starts with `{`: then every
    JSON object at its start is a call (separated by whitespace or `;`), and what
    follows the last one is the content. `"arguments"` is accepted in place of
    `"parameters"`. Any other turn is a plain answer. The tag is a special token in
    Llama's tokenizer, so the decoded text has lost it; a tokenizer that keeps it
    as text gives it here, and it is skipped.

    A turn ends with `<|eot_id|>` (the tokenizer's EOS), or with `<|eom_id|>` ("end of
    message"), with which Llama 3.1 ends a `<|python_tag|>` call when it expects the
    tool's output (`Environment: ipython` in the system prompt); both end the turn, and the
    `ipython` answer follows either."""
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    if tagged:
        body = body[len(PYTHON_TAG):].lstrip()
    if not body.startswith("{"):
        if tagged:
            return ParsedTurn(body, [], [f"{PYTHON_TAG} is not followed by a JSON object: {quote(body)}"])
        return ParsedTurn(body, [], [])
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    errors: list[str] = []
    position, number = 0, 0
    while position < len(body) and body[position] == "{":
        number += 1
        try:
            value, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError as error:
            errors.append(f"tool call {number}: the JSON does not parse ({error}): {quote(body[position:])}")
            position = len(body)  # the rest cannot be split into calls: all of it was the bad one
            break
        call = call_from_json(value, ("parameters", "arguments"))
        if isinstance(call, ToolCall):
            calls.append(call)
        else:
            errors.append(f"tool call {number}: {call}: {quote(body[position:end])}")
        position = end
        while position < len(body) and (body[position].isspace() or body[position] == ";"):
            position += 1
    return ParsedTurn(body[position:].strip(), calls, errors)


TOOL_CALLS = "[TOOL_CALLS]"
ARGS, CALL_ID = "[ARGS]", "[CALL_ID]"  # the v11+ tokenizers' markers inside a call
MISTRAL_CALL_ID = re.compile(r"^[A-Za-z0-9]{9}$")
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@tool_call_format(
    "mistral",
    tool_role="tool",
    family="Mistral 7B Instruct v0.3, Mixtral 8x22B, Mistral Nemo and other v3-tokenizer models; Mistral Small "
    "3.1/3.2, Magistral, Devstral and Ministral 3 (v11+ tokenizers)",
    written_as='v3: `[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]`, the id optional; v11+: '
    '`[TOOL_CALLS]name[ARGS]{...}` per call',
    reads_special_tokens=True,
    answers_carry_call_ids=True,
)
def parse_mistral(text: str) -> ParsedTurn:
    """Mistral's tool calls, in both of its tokenizers' forms; the tool's answer comes
    back in role `tool`, rendered between `[TOOL_RESULTS]` and `[/TOOL_RESULTS]`.

    v3 (Mistral 7B v0.3, Mixtral, Nemo): the control token `[TOOL_CALLS]` followed by a
    JSON list of `{"name": ..., "arguments": {...}}` objects, each optionally with an
    `"id"` of nine letters and digits, which the answer names (`tool_call_id`). Source:
    Mistral's tokenization guide, "Tool calling" for the v3 tokenizer
    (https://docs.mistral.ai/guides/tokenization/ and
    https://docs.mistral.ai/cookbook/concept-deep-dive-tokenization-tool_calling).
    v11 and later (Mistral Small 3.1/3.2, Magistral, Devstral, Ministral 3): each call is
    `[TOOL_CALLS]` then the tool's name, `[ARGS]` and the arguments' JSON object, calls
    written one after another, as those models' chat templates write them; an optional
    `[CALL_ID]` and id between name and `[ARGS]` is read as the call's id. Their templates
    render an answer without the id, so the id the answers carry is ignored there.

    The markers are control (special) tokens in Mistral's tokenizers, so the turn is
    read decoded with its special tokens. Text before the first marker, and after a
    call, is the content; several markers give their calls in order."""
    content: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    decoder = json.JSONDecoder()
    position, number = 0, 0
    while (marker := text.find(TOOL_CALLS, position)) >= 0:
        content.append(text[position:marker])
        start = marker + len(TOOL_CALLS)
        while start < len(text) and text[start].isspace():
            start += 1
        if _names_a_tool(text, start):  # v11+: a name, not JSON
            number += 1
            position, call = _mistral_named_call(text, start, decoder)
            if isinstance(call, ToolCall):
                calls.append(call)
            else:
                errors.append(f"tool call {number}: {call}")
            continue
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as error:
            following = text.find(TOOL_CALLS, start)
            end = len(text) if following < 0 else following
            number += 1
            errors.append(f"tool call {number}: the JSON after {TOOL_CALLS} does not parse ({error}): "
                          f"{quote(text[start:end])}")
            position = end
            continue
        position = end
        if not isinstance(value, list) or not value:
            number += 1
            got = "an empty list" if isinstance(value, list) else f"a JSON {json_type(value)}"
            errors.append(f'tool call {number}: expected a JSON list [{{"name": ..., "arguments": {{...}}}}] after '
                          f"{TOOL_CALLS}, got {got}: {quote(text[start:end])}")
            continue
        for entry in value:
            number += 1
            call = call_from_json(entry)
            if isinstance(call, ToolCall) and "id" in entry:
                call_id = entry["id"]
                if not isinstance(call_id, str) or not MISTRAL_CALL_ID.match(call_id):
                    call = f'"id" of {call.name!r} must be nine letters or digits, got {json.dumps(call_id)}'
                else:
                    call = ToolCall(call.name, call.arguments, call_id)
            if isinstance(call, ToolCall):
                calls.append(call)
            else:
                errors.append(f"tool call {number}: {call}: {quote(json.dumps(entry))}")
    content.append(text[position:])
    return ParsedTurn("".join(content).strip(), calls, errors)


def _names_a_tool(text: str, start: int) -> bool:
    """Whether the call at `start` is in the v11+ form: `[ARGS]` comes before the next
    `[TOOL_CALLS]`, or what follows the marker does not start like JSON."""
    following = text.find(TOOL_CALLS, start)
    if text.find(ARGS, start, len(text) if following < 0 else following) >= 0:
        return True
    return start < len(text) and not (text[start] in '[{"-' or text[start].isdigit())


def _mistral_named_call(text: str, start: int, decoder: json.JSONDecoder) -> tuple[int, ToolCall | str]:
    """A v11+ call `name[ARGS]{...}` (or `name[CALL_ID]id[ARGS]{...}`) at `start`: where
    reading stopped, and the call or what is wrong with it (quoting it)."""
    following = text.find(TOOL_CALLS, start)
    end = len(text) if following < 0 else following
    args = text.find(ARGS, start, end)
    if args < 0:
        return end, f"expected the tool's name, {ARGS} and a JSON object after {TOOL_CALLS}: {quote(text[start:end])}"
    name, _, call_id = text[start:args].partition(CALL_ID)
    name, call_id = name.strip(), call_id.strip() or None
    if not TOOL_NAME.match(name):
        return end, f"the tool's name before {ARGS} must be letters, digits, '_', '.' or '-', got {quote(name)}"
    body = args + len(ARGS)
    while body < end and text[body].isspace():
        body += 1
    try:
        arguments, stop = decoder.raw_decode(text, body)
    except json.JSONDecodeError as error:
        return end, f"the JSON after {ARGS} of {name!r} does not parse ({error}): {quote(text[body:end])}"
    call = call_from_json({"name": name, "arguments": arguments})
    if isinstance(call, ToolCall) and call_id is not None:
        call = ToolCall(call.name, call.arguments, call_id)
    return stop, call

if tuple(FORMATS) != FORMAT_NAMES:
    raise RuntimeError(
        f"the registered tool-call formats ({', '.join(FORMATS)}) are not those configs/tool_call_format_names.py "
        f"lists ({', '.join(FORMAT_NAMES)})"
    )


def formats_table() -> str:
    """The docs table of the formats, one row per entry."""
    lines = [
        "| `rl.env.tool_call_format` | model families | a call is written as | tool answers in role |",
        "| --- | --- | --- | --- |",
    ]
    for entry in FORMATS.values():
        written = entry.written_as.replace("|", "\\|")  # a pipe inside a cell, even in code, ends the cell
        lines.append(f"| `{entry.name}` | {entry.family} | {written} | `{entry.tool_role}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(formats_table(), end="")
