"""Model folders of the shapes users bring (issue 46), built locally: a GPT-2 with a
byte-level BPE tokenizer trained here with `tokenizers` (no chat template), the same
with a chat template, and one saved without its tokenizer files. Random weights, a
few kilobytes: nothing is downloaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# Enough text for the byte-level BPE to learn a few merges over digits and words.
CORPUS = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(20) for b in range(20)]


@dataclass(frozen=True)
class UserModels:
    plain: Path  # GPT-2, BPE tokenizer, no chat template
    chat: Path  # the same, with a chat template
    no_tokenizer: Path  # weights and config.json only


def bpe_tokenizer(chat_template: str | None = None):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=2, special_tokens=[EOS], show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def save_gpt2(folder: Path, tokenizer, *, with_tokenizer: bool = True) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer), n_layer=1, n_embd=16, n_head=2, n_positions=128, bos_token_id=eos,
        eos_token_id=eos,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    if with_tokenizer:
        tokenizer.save_pretrained(folder)
    return folder


def build_user_models(root: Path) -> UserModels:
    plain = bpe_tokenizer()
    return UserModels(
        plain=save_gpt2(root / "gpt2-plain", plain),
        chat=save_gpt2(root / "gpt2-chat", bpe_tokenizer(CHAT_TEMPLATE)),
        no_tokenizer=save_gpt2(root / "gpt2-no-tokenizer", plain, with_tokenizer=False),
    )
