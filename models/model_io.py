"""Loading models the same way on a laptop and on a GPU node, and the two forward
passes every role shares (token log-probs and per-token values).

Notation: b = batch, p = padded prompt length, r = padded response length.
Sequences are `[left-padded prompt | right-padded response]`, length p + r.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from configs.schema import ModelConfig

if TYPE_CHECKING:
    from transformers.modeling_outputs import TokenClassifierOutput
from algorithm.ppo_math import token_entropy
from data.packing import MULTIMODAL_EXTRA, MultimodalInputs, load_chat_tokenizer
from models.packed_rows import pack_rows

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# transformers' model classes are imported in the functions that load a model: the flow
# process imports this module (through the role classes it launches as actors) but
# never loads a model, and `transformers.modeling_utils` is one of the costliest imports at
# start-up. Role processes have it preloaded (processes/fork_server.py).


def quiet_transformers() -> None:
    """Load reports and progress bars from every actor would drown the run's own log."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def ensure_model(model: ModelConfig) -> str:
    """The model directory to load; builds the local tiny model on first use."""
    if model.tiny is not None and not (Path(model.path) / "config.json").exists():
        quiet_transformers()
        if model.tiny.vision is not None:
            from models.tiny_vlm import build_tiny_vlm

            build_tiny_vlm(model.path, model.tiny)
        else:
            from models.tiny_model import build_tiny_model

            build_tiny_model(model.path, model.tiny)
    return model.path


def load_tokenizer(path: str):
    """Left-padded (prompts are left-padded so responses start at one column), with a pad token."""
    return load_chat_tokenizer(path)


def load_image_processor(path: str):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(path)


def is_vision_language(path: str) -> bool:
    """A model with a vision tower (config.json has a `vision_config`): it loads as an
    image-text-to-text model and its critic is `BackboneValueModel`."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(path), "vision_config", None) is not None


def load_causal_lm(path: str, dtype: str) -> torch.nn.Module:
    """The generating model: a causal LM, or for a vision-language family its
    image-text-to-text model (a causal LM over text that also takes pixels)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    quiet_transformers()
    auto_class = AutoModelForImageTextToText if is_vision_language(path) else AutoModelForCausalLM
    return auto_class.from_pretrained(path, dtype=_DTYPES[dtype])


class BackboneValueModel(torch.nn.Module):
    """A critic for families `AutoModelForTokenClassification` does not cover (the
    vision-language ones): the model's own backbone, vision tower included, loaded
    with `AutoModel`, and a linear head giving one value per token.

    It answers like a token classifier (`.logits` of shape (b, s, 1)), so every
    caller treats both critics alike. Its checkpoint is the role's own
    (`backbone.*`, `score.*` in model.safetensors), not a Hugging Face export.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int, initializer_range: float):
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config  # the role checkpoint writes config.json from it
        self.score = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.normal_(self.score.weight, std=initializer_range)
        torch.nn.init.zeros_(self.score.bias)
        self.score.to(next(backbone.parameters()).dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> TokenClassifierOutput:
        from transformers.modeling_outputs import TokenClassifierOutput

        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        return TokenClassifierOutput(logits=self.score(hidden))


def use_attention(model: torch.nn.Module, attention: str | None) -> torch.nn.Module:
    """`model.attention` (configs/schema.py) on a loaded model; None keeps transformers' choice."""
    if attention is not None:
        model.set_attn_implementation(attention)
    return model


def load_value_model(path: str, dtype: str, seed: int) -> torch.nn.Module:
    """The critic: the policy's backbone with a scalar head per token.

    The head is new, so its initialisation is seeded here: two runs with the same
    seed start from the same critic (needed for bitwise resume comparisons).
    """
    from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

    quiet_transformers()
    config = AutoConfig.from_pretrained(path)
    if getattr(config, "vision_config", None) is not None:
        backbone = AutoModel.from_pretrained(path, dtype=_DTYPES[dtype])
        text_config = config.get_text_config()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return BackboneValueModel(backbone, text_config.hidden_size, text_config.initializer_range)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # passing it to from_pretrained raises in transformers 5
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=_DTYPES[dtype])


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left padding shifts real tokens right; positions must count real tokens only,
    as `generate` does, or scoring would see a different model than sampling."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _on_model_device(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Trajectories and targets arrive on the host (the object store holds host
    tensors); a model on a GPU needs its inputs there. On the host `.to` returns the
    very tensors it was given, so a CPU run's forwards are untouched."""
    device = model_device(model)
    return input_ids.to(device), attention_mask.to(device)


def _multimodal(extras: Mapping[str, Any] | None) -> MultimodalInputs | None:
    return None if not extras else extras.get(MULTIMODAL_EXTRA)


def _model_output(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    extras: Mapping[str, Any] | None,
    rows: Sequence[int] | torch.Tensor | None,
):
    """One forward over sequences (b, p + r). `extras` are the trajectory's (or the
    targets'), `rows` the indices of these b rows in it (None: all of them)."""
    multimodal = _multimodal(extras)
    extra_inputs = {} if multimodal is None else multimodal.forward_kwargs(input_ids.shape[1], rows)
    if extra_inputs:
        # Vision tokens take the model's own m-RoPE positions, computed from the grids
        # and token types exactly as `generate` computed them while sampling.
        extra = {name: value.to(input_ids.device) for name, value in extra_inputs.items()}
        return model(input_ids=input_ids, attention_mask=attention_mask, **extra)
    # Text rows (and every text model): exactly the call made before packers carried pixels.
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask))


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    temperature: float = 1.0,
    extras: Mapping[str, Any] | None = None,
    rows: Sequence[int] | torch.Tensor | None = None,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    pack: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (b, r) of the response tokens under `model` at `temperature`.

    Args:
        input_ids, attention_mask: (b, p + r).
        prompt_length: p.
        extras: the trajectory's extras; its `MultimodalInputs` (if any) adds the
            rows' pixels and grids to the forward and masks the tokens the engine
            never samples (S-RUN-6). None or empty for text.
        rows: which rows of the trajectory these b rows are (None: all, in order).
        with_entropy: also return the per-token entropy (b, r) of the same
            distribution, so the loss's diagnostics cost no second forward; without
            gradient unless `entropy_grad` (the `rl.entropy_coef` bonus). Either way it
            keeps no second (b, r, V) tensor (`token_entropy`).
        pack: run the b rows as one packed row (`takes_packed_rows`). Either way the
            padding columns hold numbers that mean nothing: callers mask them.

    Returns log-probs (and the entropy) on the model's device: callers that hand them
    to another role bring them to the host.
    """
    input_ids, attention_mask = _on_model_device(model, input_ids, attention_mask)
    logits = _response_outputs(model, input_ids, attention_mask, prompt_length, extras, rows, pack)
    multimodal = _multimodal(extras)
    excluded = () if multimodal is None else multimodal.never_generate
    log_probs = log_distribution(logits, temperature, excluded)  # (b, r, V)
    logprobs = _sampled(log_probs, input_ids[:, prompt_length:])
    if not with_entropy:
        return logprobs
    if entropy_grad:
        return logprobs, token_entropy(log_probs)
    with torch.no_grad():
        return logprobs, token_entropy(log_probs.detach())


def _sampled(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log-probs (b, r, V), tokens (b, r) -> the tokens' log-probs (b, r)."""
    return torch.gather(log_probs, 2, tokens.unsqueeze(-1)).squeeze(-1)


def log_distribution(
    logits: torch.Tensor, temperature: float = 1.0, excluded_token_ids: Sequence[int] = ()
) -> torch.Tensor:
    """logits (b, r, V) -> log-probs (b, r, V) at `temperature`, with
    `excluded_token_ids` (never sampled) outside the distribution (-inf)."""
    logits = logits.float() / temperature
    if excluded_token_ids:
        excluded = torch.tensor(list(excluded_token_ids), device=logits.device)
        logits = logits.index_fill(-1, excluded, float("-inf"))
    return logits.log_softmax(-1)


def logprobs_from_logits(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, excluded_token_ids: Sequence[int] = ()
) -> torch.Tensor:
    """logits (b, r, V) predicting tokens (b, r) -> log-probs (b, r), with
    `excluded_token_ids` (never sampled) outside the distribution."""
    log_probs = log_distribution(logits, temperature, excluded_token_ids)
    return _sampled(log_probs, tokens)


def response_values(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    extras: Mapping[str, Any] | None = None,
    rows: Sequence[int] | torch.Tensor | None = None,
    *,
    pack: bool = False,
) -> torch.Tensor:
    """Critic values (b, r): V of the state *before* each response token, read at the
    position that predicts it (the same alignment as the log-probs). `extras` and
    `rows` as for `response_logprobs`; on the model's device like them."""
    input_ids, attention_mask = _on_model_device(model, input_ids, attention_mask)
    return _response_outputs(model, input_ids, attention_mask, prompt_length, extras, rows, pack)[..., 0].float()


def _response_outputs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    extras: Mapping[str, Any] | None,
    rows: Sequence[int] | torch.Tensor | None,
    pack: bool,
) -> torch.Tensor:
    """The model's outputs (b, r, ·) at the positions that predict each response column.
    `pack`: run the rows as one packed row, no padding (models/packed_rows.py, S-PATH-3);
    multimodal rows are never packed (their m-RoPE positions are laid out per row)."""
    if pack and _multimodal(extras) is None:
        packed = pack_rows(input_ids, attention_mask, prompt_length)
        # use_cache=False: with a cache transformers reads no sequence boundaries from the positions.
        output = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
        return packed.response(output.logits)
    return _model_output(model, input_ids, attention_mask, extras, rows).logits[:, prompt_length - 1 : -1]
