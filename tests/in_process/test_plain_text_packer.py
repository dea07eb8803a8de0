"""Prompt shaping follows the tokenizer (S-BYO-1): a GPT-2 whose BPE tokenizer has no
chat template gets each prompt as it is; one with a template gets the template; a
conversation for the template-less one is refused naming its row and the fix."""

from __future__ import annotations

import pytest

from data.packer_choice import build_packer
from data.packing import ChatTextPacker, PlainTextPacker, UnsupportedPromptError


def test_the_prompt_text_as_it_is_where_the_tokenizer_has_no_template(user_models):
    packer = build_packer(str(user_models.plain))
    assert isinstance(packer, PlainTextPacker)
    packed = packer.pack_prompts(["What is 3 plus 4?", "7?"])
    # Left-padded with the EOS (the tokenizer has no pad token); the text decodes back unchanged.
    assert packed.attention_mask[1, 0] == 0 and packed.attention_mask[:, -1].tolist() == [1, 1]
    ids = packed.input_ids[0][packed.attention_mask[0].bool()]
    assert packer.tokenizer.decode(ids) == "What is 3 plus 4?"
    with pytest.raises(UnsupportedPromptError) as refused:
        packer.pack_prompts(["7?", [{"role": "user", "content": "7?"}]], ["rows.jsonl row 0", "rows.jsonl row 1"])
    assert str(refused.value).startswith("rows.jsonl row 1: prompt is a conversation (a list of messages)")


def test_the_chat_template_where_the_tokenizer_has_one_and_either_on_request(user_models):
    chat = build_packer(str(user_models.chat))
    assert isinstance(chat, ChatTextPacker)
    packed = chat.pack_prompts(["7?"])
    assert chat.tokenizer.decode(packed.input_ids[0]) == "user: 7?\nassistant: "
    forced = build_packer(str(user_models.chat), "data.packing:plain_text_packer")
    assert isinstance(forced, PlainTextPacker)
