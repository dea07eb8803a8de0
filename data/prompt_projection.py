"""Pick the prompt (and the reference answer) out of a row, checking its shape.

A projection, not a conversion: the prompt goes to the DataPacker as the very object
the row holds, never copied, filled or normalised (S-DATA-2). The null checks refuse
the trace a columnar reader leaves (S-DATA-5). docs/data.md "The prompt projection"
gives the accepted shapes and why.
"""

from __future__ import annotations

from contracts.faults import RepeatsOnRerun

from collections.abc import Mapping
from typing import Any

__all__ = [
    "CONTENT_PART_TYPES",
    "CONVERSATION_ROLES",
    "PAYLOAD_KEYS",
    "Prompt",
    "PromptError",
    "project_prompt",
    "project_reference",
]

Prompt = str | list[dict]

CONVERSATION_ROLES = ("system", "user", "assistant", "tool")
"""Roles a conversation row may hold (S-BYO-4): a misspelt one is refused even where a
template would render it, since a template that accepts any role trains on it silently."""

CONTENT_PART_TYPES = frozenset({"text", "image", "video", "image_url", "video_url"})
"""Values accepted under a content part's ``type``."""

PAYLOAD_KEYS = ("text", "image", "image_url", "video", "video_url", "url", "path")
"""Keys that carry a part's content; a null under any of them is refused."""

_ACCEPTED_PROMPT = (
    "accepted: a non-empty string (one user turn) or a non-empty list of messages "
    '{"role": "...", "content": ...} whose content is a non-empty string or a non-empty '
    "list of content parts"
)
_ACCEPTED_PART = (
    "accepted: an object with a string `type` among "
    + ", ".join(sorted(CONTENT_PART_TYPES))
    + " and its payload, e.g. {\"type\": \"text\", \"text\": \"...\"} or "
    "{\"type\": \"image\", \"image\": \"path/or/url.png\"}"
)
_NULL_FILL = (
    "this is the null-fill signature of a columnar reader (Arrow/`datasets`), which adds "
    "every key any part has to every part; remove the key. A parquet file or saved dataset holds "
    "these nulls in its columns: write such rows as JSON lines instead, which are read one row "
    "at a time, exactly as written"
)


class PromptError(ValueError, RepeatsOnRerun):
    """A row's prompt or reference has the wrong shape.

    The message names where the row is (``where``), the key path inside the row
    (e.g. ``prompt[1].content[0].image``) and what would be accepted; the same
    pieces are kept as attributes for callers that report differently.
    """

    def __init__(self, where: str, key_path: str, problem: str) -> None:
        self.where = where
        self.key_path = key_path
        self.problem = problem
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}`{key_path}` {problem}")

    def __reduce__(self):  # keep the attributes when pickled across processes (Ray)
        return (type(self), (self.where, self.key_path, self.problem))


def _kind(value: Any) -> str:
    """Name a value the way the JSON file spells it, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    return f"a {type(value).__name__}"


def _require_key(row: Mapping, key: str, where: str, not_an_object_hint: str, missing_hint: str) -> None:
    """A row must be an object holding `key`; the messages name the row's own keys."""
    if not isinstance(row, Mapping):
        raise PromptError(where, "<row>", f"is {_kind(row)}, not an object{not_an_object_hint}")
    if key not in row:
        keys = ", ".join(repr(k) for k in row) or "none"
        raise PromptError(where, key, f"is missing (the row's keys: {keys}); {missing_hint}")


def project_prompt(row: Mapping, *, prompt_key: str = "prompt", where: str = "") -> Prompt:
    """Return ``row[prompt_key]`` untouched (the very same object) once its shape is valid.

    ``where`` locates the row for messages, e.g. ``str(row.position)`` from the
    row reader: "data.jsonl row 3 (line 7, column 1)".
    """
    _require_key(row, prompt_key, where, f"; {_ACCEPTED_PROMPT}",
                 f"set the prompt key to the column that holds the prompt. {_ACCEPTED_PROMPT}")
    prompt = row[prompt_key]
    # S-DATA-2: a non-empty string, or a non-empty conversation; both returned as is.
    if isinstance(prompt, str):
        if not prompt:
            raise PromptError(where, prompt_key, f"is an empty string; {_ACCEPTED_PROMPT}")
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise PromptError(where, prompt_key, f"is {_kind(prompt)}; {_ACCEPTED_PROMPT}")
    for i, message in enumerate(prompt):
        _check_message(message, f"{prompt_key}[{i}]", where)
    return prompt


def _check_message(message: Any, path: str, where: str) -> None:
    if not isinstance(message, Mapping):
        raise PromptError(
            where, path, f"is {_kind(message)}, not a message object; {_ACCEPTED_PROMPT}"
        )
    for key in ("role", "content"):
        if key not in message:
            raise PromptError(where, f"{path}.{key}", f"is missing; {_ACCEPTED_PROMPT}")
    role = message["role"]
    if not isinstance(role, str) or not role:
        raise PromptError(
            where, f"{path}.role", f"is {_kind(role)}; accepted: a non-empty string such as \"user\""
        )
    if role not in CONVERSATION_ROLES:  # S-BYO-4
        raise PromptError(where, f"{path}.role", f"is {role!r}; accepted: a role among {', '.join(CONVERSATION_ROLES)}")
    content = message["content"]
    if isinstance(content, str):
        if not content:
            raise PromptError(where, f"{path}.content", f"is an empty string; {_ACCEPTED_PROMPT}")
        return
    if not isinstance(content, list) or not content:
        raise PromptError(where, f"{path}.content", f"is {_kind(content)}; {_ACCEPTED_PROMPT}")
    for j, part in enumerate(content):
        _check_part(part, f"{path}.content[{j}]", where)


def _check_part(part: Any, path: str, where: str) -> None:
    if not isinstance(part, Mapping):
        raise PromptError(where, path, f"is {_kind(part)}, not a content part; {_ACCEPTED_PART}")
    if "type" not in part:
        raise PromptError(where, f"{path}.type", f"is missing; {_ACCEPTED_PART}")
    part_type = part["type"]
    if part_type is None:
        raise PromptError(where, f"{path}.type", f"is null; {_NULL_FILL}. {_ACCEPTED_PART}")
    if not isinstance(part_type, str) or part_type not in CONTENT_PART_TYPES:
        shown = repr(part_type) if isinstance(part_type, str) else _kind(part_type)
        raise PromptError(where, f"{path}.type", f"is {shown}; {_ACCEPTED_PART}")
    # S-DATA-5: any null payload key is refused, on a part of any type. Keys
    # that are not payloads (fps, max_pixels, ...) are not looked at.
    for key in PAYLOAD_KEYS:
        if key in part and part[key] is None:
            raise PromptError(
                where,
                f"{path}.{key}",
                f"is null on a part of type {part_type!r}; {_NULL_FILL}. {_ACCEPTED_PART}",
            )
    # A part without a payload (HF-style {"type": "image"} placeholders whose
    # images sit in another column) is the DataPacker's business, not ours.
    if part_type == "text" and "text" in part and not isinstance(part["text"], str):
        raise PromptError(
            where, f"{path}.text", f"is {_kind(part['text'])}; accepted: a string (the text of a text part)"
        )


def reference_key_for(row: Mapping, reference_key: str | None, *, required: bool) -> str | None:
    """The reference column to read from this row: a reward that needs no reference
    (S-REW-2: `nonempty`, `constant`, `none`) runs on data without the column."""
    if reference_key is None or (not required and row.get(reference_key) is None):
        return None
    return reference_key


def project_reference(row: Mapping, *, reference_key: str | None, where: str = "") -> str | None:
    """The ground truth a reward compares against, as a string.

    ``None`` when no reference key is configured (rewards that need none).
    Integers are accepted and converted with ``str()`` because arithmetic data
    sets store answers as numbers; anything else (floats, booleans, lists)
    would compare by an unclear spelling, so it is refused.
    """
    if reference_key is None:
        return None
    _require_key(row, reference_key, where, "",
                 "the configured reward needs a reference answer in this column (accepted: a string or an integer)")
    value = row[reference_key]
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise PromptError(
        where,
        reference_key,
        f"is {_kind(value)}; accepted: a reference answer that is a string or an integer",
    )


def conversation_without_template(where: str, prompt_key: str, model_path: str) -> str:
    """Why a conversation cannot be shaped for a tokenizer without a chat template, and
    the fixes; the pre-flight and the packer refuse with the same words (S-BYO-1)."""
    return (
        f"{where}: {prompt_key} is a conversation (a list of messages), but the tokenizer at {model_path} has no "
        f"chat template, so the plain-text packer feeds prompts as they are; give each row a string under "
        f"rl.data.prompt_key={prompt_key!r}, save a chat template with the tokenizer (tokenizer.chat_template = "
        "...; tokenizer.save_pretrained), or set data_packer.factory"
    )
