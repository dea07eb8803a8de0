"""Tool calls (S-ENV): Qwen3's `<tool_call>` blocks read into calls, broken blocks reported
rather than raised, plain functions made into tools whose failures the model is told about,
and the ToolEnvironment's reset/step round trip."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from environments.protocol import EnvRow, Environment, checked_reset, checked_step
from environments.tool_calls import (
    QUOTE_LIMIT,
    ToolCall,
    assistant_message,
    parse_tool_calls,
    tool_calls_of,
)
from environments.tools import ToolEnvironment, ToolRegistry, ToolSchemaError


def block(name: str, arguments: object) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# Parsing ------------------------------------------------------------------------------


def test_one_call_is_read_with_its_arguments():
    parsed = parse_tool_calls(block("lookup", {"key": "a", "limit": 3}))
    assert parsed.tool_calls == [ToolCall("lookup", {"key": "a", "limit": 3})]
    assert parsed.errors == [] and parsed.content == ""


def test_several_calls_are_read_in_order_and_the_text_around_them_is_the_content():
    text = f"Let me look both up.\n{block('lookup', {'key': 'a'})}\n{block('add', {'x': 1, 'y': 2})}\n  "
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == [ToolCall("lookup", {"key": "a"}), ToolCall("add", {"x": 1, "y": 2})]
    assert parsed.content == "Let me look both up."
    assert parsed.errors == []


def test_whitespace_inside_the_block_does_not_matter_and_string_arguments_are_read():
    text = ' <tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"a\\"}"}</tool_call> ' \
           '<tool_call>\n\n   {"name": "now"}   \n</tool_call>done'
    parsed = parse_tool_calls(text)
    # a JSON string holding an object is accepted; no "arguments" means a tool that takes none
    assert parsed.tool_calls == [ToolCall("lookup", {"key": "a"}), ToolCall("now", {})]
    assert parsed.content == "done" and parsed.errors == []


def test_text_without_a_tag_is_all_content():
    parsed = parse_tool_calls('  The answer is {"name": "x"}.\n')
    assert parsed.tool_calls == [] and parsed.errors == []
    assert parsed.content == 'The answer is {"name": "x"}.'


@pytest.mark.parametrize("body, complaint", [
    ('{"name": "lookup", "arguments": {"key": "a"}', "does not parse"),
    ('["lookup", {"key": "a"}]', "got a JSON array"),
    ('{"arguments": {"key": "a"}}', '"name" must be a non-empty string'),
    ('{"name": 7, "arguments": {}}', '"name" must be a non-empty string'),
    ('{"name": "lookup", "arguments": ["a"]}', '"arguments" of \'lookup\' must be a JSON object'),
    ('{"name": "lookup", "arguments": "[1, 2]"}', '"arguments" of \'lookup\' must be a JSON object'),
    ('{"name": "lookup", "arguments": "key=a"}', "is a string that is not JSON"),
])
def test_a_block_that_is_not_a_call_is_an_error_and_the_good_block_beside_it_still_counts(body, complaint):
    parsed = parse_tool_calls(f"before <tool_call>\n{body}\n</tool_call> {block('now', {})} after")
    assert parsed.tool_calls == [ToolCall("now", {})]
    assert len(parsed.errors) == 1
    assert parsed.errors[0].startswith("tool call 1: ") and complaint in parsed.errors[0]
    assert repr(body) in parsed.errors[0]  # quoted, so the model (and the reader) sees which block
    assert parsed.content == "before   after"


def test_an_unclosed_block_is_an_error_and_a_long_block_is_quoted_short():
    long_arguments = {"text": "x" * 500}
    parsed = parse_tool_calls(f'Sure.\n<tool_call>\n{{"name": "echo", "arguments": {json.dumps(long_arguments)}}}')
    assert parsed.tool_calls == [] and parsed.content == "Sure."
    [error] = parsed.errors
    assert "has no closing </tool_call>" in error
    assert '"name": "echo"' in error and len(error) < 200  # the quote stops at QUOTE_LIMIT characters
    assert error.endswith("...'") and "x" * QUOTE_LIMIT not in error


def test_an_unclosed_block_followed_by_a_good_one_loses_only_itself():
    parsed = parse_tool_calls(f'<tool_call>{{"name": "lookup"\n{block("now", {})}')
    assert parsed.tool_calls == [ToolCall("now", {})]
    assert len(parsed.errors) == 1 and "tool call 1: <tool_call> has no closing" in parsed.errors[0]


def test_a_closing_tag_without_an_opening_one_is_reported():
    parsed = parse_tool_calls('{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>')
    assert parsed.tool_calls == []
    assert parsed.errors == ["a </tool_call> has no opening <tool_call> before it"]


# The message an environment receives ---------------------------------------------------


def test_the_assistant_message_carries_calls_in_the_hugging_face_format_and_reads_back():
    parsed = parse_tool_calls(f"Checking.\n{block('lookup', {'key': 'a'})}")
    message = assistant_message(parsed)
    assert message == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}}],
    }
    assert tool_calls_of(message) == parsed.tool_calls
    assert assistant_message(parse_tool_calls("42")) == {"role": "assistant", "content": "42"}  # no empty list
    assert tool_calls_of({"role": "assistant", "content": "42"}) == []


def test_tool_calls_of_reads_the_openai_form_and_rejects_what_is_not_a_call():
    openai_form = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}},
    ]}
    assert tool_calls_of(openai_form) == [ToolCall("lookup", {"key": "a"}, id="call_1")]  # the id is kept
    with pytest.raises(ValueError, match=r"tool_calls\[0\] is not a tool call"):
        tool_calls_of({"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]})


# The registry ---------------------------------------------------------------------------

TABLE = {"a": "apple", "b": "banana"}


def lookup(key: str, limit: int = 10) -> str:
    """Looks a key up in the table.

    Args:
        key: The key to look up.
        limit: At most this many characters of the value.
    """
    return TABLE[key][:limit]


def scale(values: list[float], factor: float) -> dict:
    """Multiplies every value.

    Args:
        values: The numbers to scale.
        factor: What to multiply them by.
    """
    return {"scaled": [value * factor for value in values]}


def test_a_typed_documented_function_gets_the_schema_chat_templates_take():
    registry = ToolRegistry([lookup, scale])
    assert registry.names() == ["lookup", "scale"]
    lookup_schema, scale_schema = registry.schemas()
    assert lookup_schema["type"] == "function"
    function = lookup_schema["function"]
    assert function["name"] == "lookup" and function["description"] == "Looks a key up in the table."
    assert function["parameters"]["properties"] == {
        "key": {"type": "string", "description": "The key to look up."},
        "limit": {"type": "integer", "description": "At most this many characters of the value."},
    }
    assert function["parameters"]["required"] == ["key"]  # limit has a default
    assert scale_schema["function"]["parameters"]["properties"]["values"]["type"] == "array"
    registry.schemas()[0]["function"]["name"] = "edited"
    assert registry.schemas()[0]["function"]["name"] == "lookup"  # callers get copies


def test_a_function_that_cannot_be_a_tool_fails_when_added_and_names_itself():
    def undocumented(key: str) -> str:
        return key

    def untyped(key):
        """Echoes.

        Args:
            key: The key.
        """
        return key

    registry = ToolRegistry()
    with pytest.raises(ToolSchemaError, match=r"tool test_a_function.*undocumented: .*no docstring.*Args:"):
        registry.add(undocumented)
    with pytest.raises(ToolSchemaError, match=r"untyped: .*missing a type hint"):
        registry.add(untyped)
    registry.add(lookup)
    with pytest.raises(ToolSchemaError, match="a tool named 'lookup' is already"):
        registry.add(lookup)


def test_add_works_as_a_decorator():
    registry = ToolRegistry()

    @registry.add
    def shout(text: str) -> str:
        """Upper-cases text.

        Args:
            text: What to shout.
        """
        return text.upper()

    assert shout("hi") == "HI" and registry.names() == ["shout"]


def test_a_good_call_answers_as_a_tool_message_and_non_strings_are_json():
    registry = ToolRegistry([lookup, scale])
    assert registry.call(ToolCall("lookup", {"key": "b", "limit": 3})).message == \
        {"role": "tool", "name": "lookup", "content": "ban"}
    result = registry.call(ToolCall("scale", {"values": [1, 2], "factor": 0.5}))
    assert result.error is False and json.loads(result.message["content"]) == {"scaled": [0.5, 1.0]}


@pytest.mark.parametrize("call, told", [
    (ToolCall("search", {"q": "x"}), "error: there is no tool named 'search'; the tools are: lookup, scale"),
    (ToolCall("lookup", {"limit": 2}), "error: lookup(key: string, limit?: integer) cannot take arguments "
                                       "{\"limit\": 2}: missing a required argument: 'key'"),
    (ToolCall("lookup", {"key": "a", "colour": "red"}), "got an unexpected keyword argument 'colour'"),
    (ToolCall("lookup", {"key": "zz"}), "error: lookup raised KeyError: 'zz'"),
])
def test_a_failing_call_tells_the_model_what_went_wrong_instead_of_raising(call, told):
    result = ToolRegistry([lookup, scale]).call(call)
    assert result.error is True
    assert result.message["role"] == "tool" and result.message["name"] == call.name
    assert result.message["content"].startswith("error: ") and told in result.message["content"]


# The environment ------------------------------------------------------------------------


class LookupEnvironment(ToolEnvironment):
    """Asks for a key's value, which only the tool knows: the answer must be that value."""

    tools = ToolRegistry([lookup])

    def opening(self, row: EnvRow, seed: int) -> list[dict]:
        self.expected = TABLE[row.reference]
        return [{"role": "user", "content": row.prompt}]

    def answer(self, content: str) -> float:
        return 1.0 if content == self.expected else 0.0


def episode_row() -> EnvRow:
    return EnvRow(prompt="What is stored under b?", reference="b", metadata={}, row_id=0)


def test_a_tool_environment_runs_calls_until_an_answer_and_rewards_the_answer():
    environment = LookupEnvironment()
    assert isinstance(environment, Environment)
    reset = checked_reset(environment.reset(episode_row(), seed=0))
    assert reset.messages == [{"role": "user", "content": "What is stored under b?"}]
    assert [tool["function"]["name"] for tool in reset.tools] == ["lookup"]

    turn = parse_tool_calls(f"{block('lookup', {'key': 'b'})}{block('lookup', {'key': 'q'})}")
    step = checked_step(environment.step(assistant_message(turn)))
    assert step.done is False and step.reward == 0.0
    assert [message["content"] for message in step.messages] == ["banana", "error: lookup raised KeyError: 'q'"]
    assert environment.tool_errors == 1

    final = checked_step(environment.step(assistant_message(parse_tool_calls("banana"))))
    assert (final.messages, final.reward, final.done) == ([], 1.0, True)
    assert LookupEnvironment().tool_errors == 0  # counted per episode, not on the class


def test_a_wrong_answer_earns_nothing_and_an_environment_without_tools_says_so():
    environment = LookupEnvironment()
    environment.reset(episode_row(), seed=0)
    assert environment.step(assistant_message(parse_tool_calls("apple"))).reward == 0.0

    class NoTools(ToolEnvironment):
        def opening(self, row, seed):
            return [{"role": "user", "content": "hi"}]

        def answer(self, content):
            return 0.0

    with pytest.raises(TypeError, match=r"NoTools.tools is NoneType, not a ToolRegistry"):
        NoTools().reset(episode_row(), seed=0)


# A real chat template --------------------------------------------------------------------

# Qwen3's way of showing tools, calls and tool results, cut to those parts: calls are read
# from `tool_calls[].function` and their arguments written with `tojson`.
TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
)


def test_the_assistant_message_renders_through_a_hugging_face_chat_template_as_the_model_wrote_it():
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tokenizer.chat_template = TOOL_TEMPLATE
    registry = ToolRegistry([lookup])
    written = f"I will look it up.\n{block('lookup', {'key': 'b'})}"
    turn = parse_tool_calls(written)
    tool_reply = registry.call(turn.tool_calls[0]).message
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is under b?"}, assistant_message(turn), tool_reply],
        tools=registry.schemas(), tokenize=False,
    )
    assert f"<|im_start|>assistant\n{written}<|im_end|>" in rendered  # the same text the policy generated
    assert "<tool_response>\nbanana\n</tool_response>" in rendered
    assert json.dumps(registry.schemas()[0]) in rendered
