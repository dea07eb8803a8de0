"""The tiny agent task (configs/ppo_tiny_tools_cpu.py): a value only the `get` tool can
tell, a tokenizer template whose tool calls the episode loop parses back, and splits
that share no key (S-ENV-1)."""

from __future__ import annotations

from data.synthetic import key_lookup_split
from environments.chat_tokens import ObservationEncoder
from environments.key_lookup import make_environment
from environments.protocol import EnvRow
from environments.tool_calls import assistant_message, parse_tool_calls
from models.tiny_model import CHAT_TEMPLATE, TOOL_CHAT_TEMPLATE, build_tokenizer

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" + ' <>/_{}":,()?'


def _row() -> EnvRow:
    (row,) = key_lookup_split(1, seed=3, split="heldout")
    return EnvRow(row["prompt"], row["reference"], {"key": row["key"]}, row_id=0)


def test_the_value_is_hidden_and_only_the_tool_tells_it():
    row = _row()
    env = make_environment()
    reset = env.reset(row, seed=0)
    assert row.reference not in str(reset.messages) and reset.tools[0]["function"]["name"] == "get"
    call = f'<tool_call>\n{{"name": "get", "arguments": {{"key": "{row.metadata["key"]}"}}}}\n</tool_call>'
    step = env.step(assistant_message(parse_tool_calls(call)))
    assert not step.done and step.messages[0]["content"] == row.reference
    assert env.step({"role": "assistant", "content": row.reference}).reward == 1.0
    assert make_environment().step({"role": "assistant", "content": "000"}).reward == 0.0


def test_the_tool_template_writes_calls_the_episode_loop_reads_and_renders_plain_chats_unchanged():
    tools = build_tokenizer(ALPHABET, TOOL_CHAT_TEMPLATE)
    plain = build_tokenizer(ALPHABET, CHAT_TEMPLATE)
    chat = [{"role": "user", "content": "value of QX?"}, {"role": "assistant", "content": "493"}]
    assert tools.apply_chat_template(chat, tokenize=False) == plain.apply_chat_template(chat, tokenize=False)
    row = _row()
    env = make_environment()
    reset = env.reset(row, seed=0)
    call = {"type": "function", "function": {"name": "get", "arguments": {"key": row.metadata["key"]}}}
    rendered = tools.apply_chat_template(
        reset.messages + [{"role": "assistant", "content": "", "tool_calls": [call]}], tools=reset.tools,
        tokenize=False,
    )
    turn = rendered.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    parsed = parse_tool_calls(turn)  # what a model trained on this text writes, the loop reads
    assert parsed.errors == [] and [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get", {"key": row.metadata["key"]})]
    observation = ObservationEncoder(tools, tools.eos_token).text([{"role": "tool", "content": "493"}])
    assert observation == (
        "\n<|im_start|>user\n<tool_response>\n493\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_splits_share_no_key_and_no_value():
    train = list(key_lookup_split(2000, seed=0, split="train"))
    heldout = list(key_lookup_split(500, seed=1, split="heldout"))
    assert {r["key"] for r in train}.isdisjoint({r["key"] for r in heldout})
    assert {r["reference"] for r in train}.isdisjoint({r["reference"] for r in heldout})
