"""Prompt and reference projection: pass-through identity and every refusal (S-DATA-2, S-DATA-5)."""

from __future__ import annotations

import json
import pickle

import pytest

from data.prompt_projection import PromptError, project_prompt, project_reference
from data.row_reader import iter_rows

WHERE = "file.jsonl row 3 (line 7, column 1)"


def user(content):
    return {"role": "user", "content": content}


# --------------------------------------------------------------------------- #
# Accepted prompts pass through as the very same object (S-DATA-2)
# --------------------------------------------------------------------------- #

ACCEPTED = {
    "string": "What is 2 + 2?",
    "conversation_of_strings": [
        {"role": "system", "content": "Be brief."},
        user("What is 2 + 2?"),
    ],
    "mixed_string_and_part_contents": [
        {"role": "system", "content": "Describe images."},
        user([{"type": "image", "image": "a.png"}, {"type": "text", "text": "What is this?"}]),
    ],
    "every_part_type": [
        user(
            [
                {"type": "text", "text": ""},
                {"type": "image", "url": "https://x/a.png"},
                {"type": "image", "path": "a.png", "max_pixels": 1024},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "video", "video": ["f0.png", "f1.png"], "fps": 2},
                {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
            ]
        )
    ],
    # S-DATA-5: a null under a part's own optional key is the DataPacker's to read.
    "null_optional_keys_left_alone": [
        user(
            [
                {"type": "video", "video": "v.mp4", "fps": None, "max_pixels": None},
                {"type": "image", "image": "a.png", "resized_height": None},
            ]
        )
    ],
    "placeholder_part_without_payload": [user([{"type": "image"}, {"type": "text", "text": "?"}])],
    "extra_message_keys": [{"role": "assistant", "content": "4", "name": None, "weight": 0}],
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_prompts_are_returned_untouched(name):
    prompt = ACCEPTED[name]
    snapshot = json.dumps(prompt, sort_keys=True)
    row = {"prompt": prompt, "answer": 4}
    assert project_prompt(row, where=WHERE) is prompt
    assert json.dumps(prompt, sort_keys=True) == snapshot  # nothing normalised in place
    assert sorted(row) == ["answer", "prompt"]


def test_custom_prompt_key():
    messages = [user("hi")]
    assert project_prompt({"messages": messages}, prompt_key="messages") is messages


def test_rows_from_the_reader_project_with_their_position(tmp_path):
    """The two modules together: the reader's position is the projection's ``where``."""
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"prompt": "ok"}\n\n  {"prompt": [{"role": "user", "content": [{"type": "text", "text": null}]}]}\n'
    )
    rows = list(iter_rows(str(path)))
    assert project_prompt(rows[0].value, where=str(rows[0].position)) == "ok"
    with pytest.raises(PromptError) as info:
        project_prompt(rows[1].value, where=str(rows[1].position))
    assert str(info.value).startswith(f"{path} row 1 (line 3, column 3): `prompt[0].content[0].text` is null")


# --------------------------------------------------------------------------- #
# Refusals name the row, the key path and what is accepted
# --------------------------------------------------------------------------- #

# Each case: row, key path, phrase the message must hold.
REFUSED = {
    "missing_prompt": ({"question": "hi"}, "prompt", "is missing (the row's keys: 'question')"),
    "null_prompt": ({"prompt": None}, "prompt", "is null"),
    "empty_string": ({"prompt": ""}, "prompt", "is an empty string"),
    "number_prompt": ({"prompt": 3}, "prompt", "is a number"),
    "object_prompt": ({"prompt": {"role": "user"}}, "prompt", "is an object"),
    "empty_conversation": ({"prompt": []}, "prompt", "is an empty list"),
    "message_not_object": ({"prompt": [user("a"), "b"]}, "prompt[1]", "is a string, not a message object"),
    "message_without_role": ({"prompt": [{"content": "a"}]}, "prompt[0].role", "is missing"),
    "message_without_content": ({"prompt": [{"role": "user"}]}, "prompt[0].content", "is missing"),
    "null_role": ({"prompt": [{"role": None, "content": "a"}]}, "prompt[0].role", "is null"),
    "empty_role": ({"prompt": [{"role": "", "content": "a"}]}, "prompt[0].role", "is an empty string"),
    # S-BYO-4: refused even where a template would render it (Llama 3's renders any role).
    "misspelt_role": (
        {"prompt": [user("a"), {"role": "asistant", "content": "b"}]}, "prompt[1].role",
        "is 'asistant'; accepted: a role among system, user, assistant, tool",
    ),
    "null_content": ({"prompt": [user(None)]}, "prompt[0].content", "is null"),
    "empty_content": ({"prompt": [user("")]}, "prompt[0].content", "is an empty string"),
    "empty_parts": ({"prompt": [user([])]}, "prompt[0].content", "is an empty list"),
    "part_not_object": ({"prompt": [user(["hi"])]}, "prompt[0].content[0]", "is a string, not a content part"),
    "part_without_type": ({"prompt": [user([{"text": "hi"}])]}, "prompt[0].content[0].type", "is missing"),
    "unknown_part_type": (
        {"prompt": [user([{"type": "audio", "audio": "a.wav"}])]},
        "prompt[0].content[0].type",
        "is 'audio'",
    ),
    "text_not_a_string": (
        {"prompt": [user([{"type": "text", "text": 5}])]},
        "prompt[0].content[0].text",
        "is a number",
    ),
    # S-DATA-5: the null-fill signature.
    "null_type": (
        {"prompt": [user([{"type": None, "text": "hi"}])]},
        "prompt[0].content[0].type",
        "is null; this is the null-fill signature",
    ),
    "image_null_on_text_part": (
        {"prompt": [user("sys"), user([{"type": "text", "text": "hi", "image": None}])]},
        "prompt[1].content[0].image",
        "is null on a part of type 'text'; this is the null-fill signature",
    ),
    "text_null_on_image_part": (
        {"prompt": [user([{"type": "image", "image": "a.png", "text": None}])]},
        "prompt[0].content[0].text",
        "is null on a part of type 'image'; this is the null-fill signature",
    ),
    "image_null_on_image_part_with_url": (
        {"prompt": [user([{"type": "image", "url": "https://x/a.png", "image": None}])]},
        "prompt[0].content[0].image",
        "is null on a part of type 'image'",
    ),
    "image_null_on_image_part_with_path": (
        {"prompt": [user([{"type": "image", "image": None, "path": "a.png"}])]},
        "prompt[0].content[0].image",
        "is null on a part of type 'image'",
    ),
    "video_null_on_text_part": (
        {"prompt": [user([{"type": "text", "text": "a"}, {"type": "text", "text": "b", "video": None}])]},
        "prompt[0].content[1].video",
        "is null on a part of type 'text'",
    ),
    "url_null_on_image_url_part": (
        {"prompt": [user([{"type": "image_url", "image_url": {"url": "u"}, "url": None}])]},
        "prompt[0].content[0].url",
        "is null on a part of type 'image_url'",
    ),
    "image_url_null_on_video_url_part": (
        {"prompt": [user([{"type": "video_url", "video_url": "v", "image_url": None}])]},
        "prompt[0].content[0].image_url",
        "is null on a part of type 'video_url'",
    ),
    "path_null_on_video_part": (
        {"prompt": [user([{"type": "video", "video": "v.mp4", "path": None, "fps": None}])]},
        "prompt[0].content[0].path",
        "is null on a part of type 'video'",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refusals_name_where_the_key_path_and_what_is_accepted(name):
    row, key_path, phrase = REFUSED[name]
    with pytest.raises(PromptError) as info:
        project_prompt(row, where=WHERE)
    err = info.value
    assert (err.where, err.key_path) == (WHERE, key_path)
    assert str(err).startswith(f"{WHERE}: `{key_path}` {phrase}")
    assert "accepted:" in str(err)


def test_message_without_where_starts_at_the_key_path():
    with pytest.raises(PromptError) as info:
        project_prompt({"prompt": ""})
    assert str(info.value).startswith("`prompt` is an empty string; accepted: a non-empty string")


def test_non_mapping_row_is_refused():
    with pytest.raises(PromptError, match="is a list, not an object"):
        project_prompt(["prompt"], where=WHERE)  # type: ignore[arg-type]


def test_prompt_error_pickles_with_its_attributes():
    err = PromptError(WHERE, "prompt[0].content", "is null")
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.where, copy.key_path, str(copy)) == (WHERE, "prompt[0].content", str(err))
    assert isinstance(copy, ValueError)


# --------------------------------------------------------------------------- #
# Reference answers
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("value", "expected"),
    [("42", "42"), ("x = 3", "x = 3"), (42, "42"), (-7, "-7"), (0, "0")],
)
def test_reference_is_a_string(value, expected):
    assert project_reference({"answer": value}, reference_key="answer") == expected


def test_no_reference_key_means_no_reference():
    assert project_reference({"answer": "4"}, reference_key=None) is None
    assert project_reference({}, reference_key=None) is None


@pytest.mark.parametrize(
    ("row", "phrase"),
    [
        ({"prompt": "p", "label": 4}, "`answer` is missing (the row's keys: 'prompt', 'label')"),
        ({"answer": None}, "`answer` is null; accepted: a reference answer that is a string or an integer"),
        ({"answer": 4.0}, "`answer` is a number; accepted: a reference answer that is a string or an integer"),
        ({"answer": True}, "`answer` is a boolean"),
        ({"answer": ["4"]}, "`answer` is a list"),
    ],
)
def test_reference_refusals_name_the_column(row, phrase):
    with pytest.raises(PromptError) as info:
        project_reference(row, reference_key="answer", where=WHERE)
    assert str(info.value).startswith(f"{WHERE}: {phrase}")
    assert info.value.key_path == "answer"
