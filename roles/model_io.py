"""Loading models the same way on a laptop and on a GPU node, and the two forward
passes every role shares (token log-probs and per-token values).

Notation: b = batch, p = padded prompt length, r = padded response length.
Sequences are `[left-padded prompt | right-padded response]`, length p + r.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from configs.schema import ModelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def quiet_transformers() -> None:
    """Load reports and progress bars from every actor would drown the run's own log."""
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def ensure_model(model: ModelConfig) -> str:
    """The model directory to load; builds the local tiny model on first use."""
    if model.tiny is not None and not (Path(model.path) / "config.json").exists():
        from roles.tiny_model import build_tiny_model

        build_tiny_model(model.path, model.tiny)
    return model.path


def load_tokenizer(path: str):
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"  # prompts are left-padded so responses start at one column
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: str) -> torch.nn.Module:
    quiet_transformers()
    return AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])


def load_value_model(path: str, dtype: str, seed: int) -> torch.nn.Module:
    """The critic: the policy's backbone with a scalar head per token.

    The head is new, so its initialisation is seeded here: two runs with the same
    seed start from the same critic (needed for bitwise resume comparisons).
    """
    quiet_transformers()
    config = AutoConfig.from_pretrained(path)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # passing it to from_pretrained raises in transformers 5
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=_DTYPES[dtype])


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left padding shifts real tokens right; positions must count real tokens only,
    as `generate` does, or scoring would see a different model than sampling."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probs (b, r) of the response tokens under `model` at `temperature`.

    Args:
        input_ids, attention_mask: (b, p + r).
        prompt_length: p.
    """
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask)
    ).logits
    return logprobs_from_logits(logits[:, prompt_length - 1 : -1], input_ids[:, prompt_length:], temperature)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits (b, r, V) predicting tokens (b, r) -> log-probs (b, r)."""
    logits = logits.float() / temperature
    return torch.gather(logits.log_softmax(-1), 2, tokens.unsqueeze(-1)).squeeze(-1)


def response_values(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
) -> torch.Tensor:
    """Critic values (b, r): V of the state *before* each response token, read at the
    position that predicts it (the same alignment as the log-probs)."""
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask)
    ).logits
    return logits[:, prompt_length - 1 : -1, 0].float()
