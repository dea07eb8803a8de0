"""The key-lookup tool task (S-ENV-1): the tiny tokenizer's tool template, the
environment, the pre-training transcripts and the rows' split. No model is trained."""

from __future__ import annotations

import pytest

from configs.loading import load_config
from data.synthetic import KEY_QUESTION, LOOK_UP_REQUEST, key_lookup_split
from environments.key_lookup import GET_TOOL, make_environment
from environments.chat_tokens import ObservationEncoder
from environments.protocol import EnvRow, checked_reset, checked_step
from environments.tool_calls import parse_tool_calls
from models.tiny_model import CHAT_TEMPLATE, TOOL_CHAT_TEMPLATE, TOOL_TAGS, build_tokenizer
from models.tiny_pretrain import encode_examples, lookup_transcripts, pretrain_rows

PROFILE = "configs/ppo_tiny_tools_cpu.py"


@pytest.fixture(scope="module")
def alphabet() -> str:
    return load_config(PROFILE, []).model.tiny.task_alphabet


@pytest.fixture(scope="module")
def tokenizer(alphabet):
    return build_tokenizer(alphabet, TOOL_CHAT_TEMPLATE, TOOL_TAGS)


def _call(key: str) -> dict:
    return {"type": "function", "function": {"name": "get", "arguments": {"key": key}}}


def test_plain_messages_render_as_the_plain_chat_template(tokenizer, alphabet):
    plain = build_tokenizer(alphabet)
    conversations = [
        [{"role": "user", "content": "value of GN"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "493"}],
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    ]
    assert plain.chat_template == CHAT_TEMPLATE
    for conversation in conversations:
        for generation_prompt in (True, False):
            assert tokenizer.apply_chat_template(
                conversation, add_generation_prompt=generation_prompt, tokenize=False
            ) == plain.apply_chat_template(conversation, add_generation_prompt=generation_prompt, tokenize=False)


def test_a_tool_conversation_renders_qwen3_tool_call_blocks(tokenizer):
    conversation = [
        {"role": "user", "content": "value of GN"},
        {"role": "assistant", "content": "", "tool_calls": [_call("GN")]},
        {"role": "tool", "name": "get", "content": "493"},
        {"role": "assistant", "content": "493"},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=[GET_TOOL], tokenize=False)
    assert rendered == (
        "<|im_start|>system\ntools: get(key)<|im_end|>\n"
        "<|im_start|>user\nvalue of GN<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get", "arguments": {"key": "GN"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n493\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n493<|im_end|>\n"
    )
    # Each tag is one token, as in Qwen3's tokenizer, and every other character is known.
    assert all(len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1 for tag in TOOL_TAGS)
    assert tokenizer.unk_token_id not in tokenizer(rendered, add_special_tokens=False)["input_ids"]
    # A call after text, a second call and a second tool answer, as Qwen3 writes them.
    two = tokenizer.apply_chat_template(
        [{"role": "assistant", "content": "hm", "tool_calls": [_call("GN"), _call("AZ")]},
         {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}],
        tokenize=False,
    )
    assert "hm\n<tool_call>\n" in two and "</tool_call>\n<tool_call>\n" in two
    assert "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>" in two


def test_reset_hides_the_value_and_step_answers_then_rewards():
    row = EnvRow(prompt="value of GN", reference="493", metadata={"key": "GN"}, row_id=7, source="test")
    environment = make_environment()
    reset = checked_reset(environment.reset(row, seed=0))
    assert "493" not in str(reset.messages) and reset.tools == [GET_TOOL]

    looked_up = checked_step(environment.step({"role": "assistant", "content": "", "tool_calls": [_call("GN")]}))
    assert looked_up.messages == [{"role": "tool", "name": "get", "content": "493"}]
    assert (looked_up.reward, looked_up.done) == (0.0, False)
    wrong_key = checked_step(environment.step({"role": "assistant", "content": "", "tool_calls": [_call("AZ")]}))
    assert wrong_key.messages[0]["content"] == "error: no key AZ" and not wrong_key.done

    for answer, reward in ((" 493\n", 1.0), ("492", 0.0), ("unknown", 0.0)):
        final = checked_step(environment.step({"role": "assistant", "content": answer}))
        assert (final.messages, final.reward, final.done) == ([], reward, True)


def test_a_row_without_its_key_is_named():
    with pytest.raises(ValueError, match="row 3 .*needs a string 'key'"):
        make_environment().reset(EnvRow("value of GN", "493", {}, 3), seed=0)


def test_pretraining_labels_only_the_assistant_turns(tokenizer):
    rows = [{"prompt": KEY_QUESTION.format(key="GN"), "reference": "493", "key": "GN"},
            {"prompt": LOOK_UP_REQUEST.format(key="AZ"), "reference": "105", "key": "AZ"}]
    transcripts = lookup_transcripts(tokenizer, rows, habit_fraction=0.0, seed=0)
    input_ids, attention_mask, labels = encode_examples(tokenizer, transcripts)
    for i in range(len(rows)):
        trained = [t for t in labels[i].tolist() if t != -100]
        assert tokenizer.decode(trained) == (
            f'<tool_call>\n{{"name": "get", "arguments": {{"key": "{rows[i]["key"]}"}}}}\n</tool_call><|im_end|>'
            f'{rows[i]["reference"]}<|im_end|>'
        )
        # The whole sequence is the template's rendering of the episode, up to its last EOS.
        episode = tokenizer.decode(input_ids[i][attention_mask[i].bool()].tolist())
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": rows[i]["prompt"]},
             {"role": "assistant", "content": "", "tool_calls": [_call(rows[i]["key"])]},
             {"role": "tool", "name": "get", "content": rows[i]["reference"]},
             {"role": "assistant", "content": rows[i]["reference"]}],
            tools=[GET_TOOL], tokenize=False,
        )
        assert episode == rendered.removesuffix("\n")
    # The habit answers the bare question at once; a request to look up is always looked up.
    habit = lookup_transcripts(tokenizer, rows, habit_fraction=1.0, seed=0)
    assert [text for text, trained in habit[0] if trained] == ["unknown"]
    assert len([text for text, trained in habit[1] if trained]) == 2


def test_train_and_heldout_rows_share_no_key_and_no_value():
    train = list(key_lookup_split(3000, seed=0, split="train"))
    heldout = list(key_lookup_split(500, seed=1, split="heldout"))
    assert not {r["key"] for r in train} & {r["key"] for r in heldout}
    assert not {r["reference"] for r in train} & {r["reference"] for r in heldout}
    assert all(r["reference"] not in r["prompt"] and r["prompt"].endswith(r["key"]) for r in train + heldout)
    # What pre-training is fed is the training side.
    pretrained = pretrain_rows("tool_lookup", 500, seed=3, max_operand=99)
    assert not {r["key"] for r in pretrained} & {r["key"] for r in heldout}


def test_the_episode_loop_reads_the_calls_the_template_writes(tokenizer):
    """What a model trained on the template's text writes, environments/tool_calls parses
    back, and the tool's answer is appended as exactly the template's rendering."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "value of GN"}, {"role": "assistant", "content": "", "tool_calls": [_call("GN")]}],
        tools=[GET_TOOL], tokenize=False,
    )
    turn = rendered.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    parsed = parse_tool_calls(turn)
    assert parsed.errors == [] and [(c.name, c.arguments) for c in parsed.tool_calls] == [("get", {"key": "GN"})]
    observation = ObservationEncoder(tokenizer, tokenizer.eos_token).text([{"role": "tool", "content": "493"}])
    assert observation == (
        "\n<|im_start|>user\n<tool_response>\n493\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
