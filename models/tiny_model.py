"""A tiny Qwen3 model and character tokenizer, built locally in Hugging Face format.

The CPU profile and the tests must not download anything, yet every role must load
its model through the same `from_pretrained(path)` call that loads Qwen/Qwen3-0.6B on
a GPU node. So the tiny model is *written to disk* in standard format first and then
loaded like any other. Character-level tokens keep each digit a single token, which
is what arithmetic rewards need.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
from filelock import FileLock
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from configs.schema import TinyModelSpec, TinyRewardModelSpec
from models.tiny_pretrain import pretrain
from models.tiny_spec import write_tiny_spec

PAD, EOS, BOS, UNK = "<|pad|>", "<|im_end|>", "<|im_start|>", "<|unk|>"
SPECIAL_TOKENS = [PAD, EOS, BOS, UNK]

# ChatML, as Qwen uses: the rollout's DataPacker applies it with add_generation_prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# CHAT_TEMPLATE with Qwen3's tool forms, written compactly for a character-level model:
# the tools as one system line (`tools: get(key)`), an assistant's calls as Qwen3's
# `<tool_call>\n{json}\n</tool_call>` blocks (the form the episode loop parses), tool
# results inside a user turn as `<tool_response>\n...\n</tool_response>`. Messages
# without tools render byte-identical to CHAT_TEMPLATE. A newline right after a block
# tag is written `{{ '\n' }}`: transformers renders with trim_blocks, which drops it.
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}tools: "
    "{% for tool in tools %}{% set tool = tool['function'] if tool['function'] is defined else tool %}"
    "{{ tool['name'] }}({{ tool['parameters']['properties'] | list | join(',') }}){% if not loop.last %} {% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif not (tools and loop.first and message['role'] == 'system') %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}{% set call = call['function'] if call['function'] is defined "
    "else call %}{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": {{ call['name'] | tojson }}, \"arguments\": "
    "{% if call['arguments'] is string %}{{ call['arguments'] }}{% else %}{{ call['arguments'] | tojson }}{% endif %}"
    "}\n</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3's tokenizer holds each tool tag as one token (not a special one: it decodes
# into the text the tool-call parser reads); so does the tool task's tiny tokenizer.
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

ROLE_CHARACTERS = "userassistantsystem\n"


def build_tokenizer(
    alphabet: str, chat_template: str = CHAT_TEMPLATE, words: tuple[str, ...] = ()
) -> PreTrainedTokenizerFast:
    """One token per character of `alphabet`, the special tokens, and each of `words` whole."""
    characters = sorted(set(alphabet) | set(ROLE_CHARACTERS))
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + list(words) + characters)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.add_tokens(list(words))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
    )
    fast.chat_template = chat_template
    return fast


def build_once(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Run `write(staging)` once for the model folder `path`, atomically.

    Built in a sibling temp folder and renamed, so two processes racing on first use
    both see either nothing or a complete model. Every model-loading actor calls a
    builder at start-up; with pre-training a build takes a minute, so the others wait
    on a file lock for the first instead of each building the same model again on
    the same cores."""
    target = Path(path)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if (target / "config.json").exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            write(staging)
            try:
                os.rename(staging, target)
            except OSError:
                if not (target / "config.json").exists():
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def build_tiny_model(path: str | Path, spec: TinyModelSpec) -> Path:
    """Write the tiny model and tokenizer to `path` (once; see `build_once`)."""
    return build_once(path, lambda staging: (_write(staging, spec), write_tiny_spec(staging, spec)))


def text_model_kwargs(spec: TinyModelSpec | TinyRewardModelSpec, tokenizer) -> dict:
    """The language model's dimensions and special tokens, shared by the text model's
    config and a tiny VLM's `text_config`."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def seeded_model(model_class: type, config: Any, seed: int, tokenizer: Any) -> Any:
    """A freshly initialised model that depends on `seed` alone (the global RNG is left
    as it was), generating with the tokenizer's special tokens."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return model


def _write(staging: Path, spec: TinyModelSpec) -> None:
    # Only the tool task's models know the tool forms: every other tiny model's tokenizer stays as built before.
    if spec.pretrain_task == "tool_lookup":
        tokenizer = build_tokenizer(spec.task_alphabet, TOOL_CHAT_TEMPLATE, TOOL_TAGS)
    else:
        tokenizer = build_tokenizer(spec.task_alphabet)
    config = Qwen3Config(
        **text_model_kwargs(spec, tokenizer),
        head_dim=spec.hidden_size // spec.num_attention_heads,
        tie_word_embeddings=True,
    )
    model = seeded_model(Qwen3ForCausalLM, config, spec.seed, tokenizer)
    if spec.pretrain_task != "none" and spec.pretrain_steps > 0:
        report = pretrain(
            model,
            tokenizer,
            task=spec.pretrain_task,
            steps=spec.pretrain_steps,
            batch_size=spec.pretrain_batch_size,
            lr=spec.pretrain_lr,
            max_operand=spec.pretrain_max_operand,
            seed=spec.seed,
            min_digits=spec.pretrain_min_digits,
            max_digits=spec.pretrain_max_digits,
            period_fraction=spec.pretrain_period_fraction,
        )
        # Provenance beside the weights: what the model was taught before PPO.
        (staging / "tiny_pretrain.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
