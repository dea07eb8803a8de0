"""The tiny model is made locally, deterministically, in standard HF format."""

import hashlib
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from configs.schema import TinyModelSpec
from models.model_io import load_value_model
from models.tiny_model import build_tiny_model


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_same_seed_same_bytes_and_loads_with_from_pretrained(tmp_path):
    spec = TinyModelSpec(task_alphabet="0123456789+=")
    first = build_tiny_model(tmp_path / "a", spec)
    second = build_tiny_model(tmp_path / "b", spec)
    other = build_tiny_model(tmp_path / "c", spec.model_copy(update={"seed": 1}))
    assert _digest(first) == _digest(second) != _digest(other)

    model = AutoModelForCausalLM.from_pretrained(first)
    tokenizer = AutoTokenizer.from_pretrained(first)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    # Character level: "42" is two tokens, so arithmetic rewards see every digit.
    assert len(tokenizer("42", add_special_tokens=False)["input_ids"]) == 2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "4+2="}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    # A plain `generate` on the saved model must stop at the tokenizer's <|im_end|>, as a
    # chat model from the hub does: bias greedy decoding onto EOS and it is the only new token.
    eos = tokenizer.eos_token_id
    generated = model.generate(ids, max_new_tokens=3, do_sample=False, sequence_bias={(eos,): 100.0})
    assert generated[0, ids.shape[1]:].tolist() == [eos]


def test_critic_is_the_backbone_with_a_seeded_scalar_head(tmp_path):
    path = str(build_tiny_model(tmp_path / "m", TinyModelSpec()))
    critic_a = load_value_model(path, "float32", seed=3)
    critic_b = load_value_model(path, "float32", seed=3)
    assert critic_a.config.num_labels == 1
    torch.testing.assert_close(critic_a.score.weight, critic_b.score.weight, rtol=0, atol=0)
