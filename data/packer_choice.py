"""Which DataPacker a run uses (S-RUN-6): a configured factory, or the built-in one
the model's config.json calls for.

Kept apart from data/packing.py (the packer interface and the text packer) and
data/vision_packer.py (the Qwen-VL packer, built on packing.py), so that neither of
those imports the other back.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from data.packing import DataPacker, text_packer
from data.vision_packer import qwen_vl_packer
from files.model_folder import QWEN_VL_MODEL_TYPES


def build_packer(
    model_path: str,
    factory: str | None = None,
    factory_kwargs: Mapping[str, Any] | None = None,
    trusted: Iterable[str] = (),
) -> DataPacker:
    """The DataPacker of a run (`data_packer.factory`, `data_packer.factory_kwargs`).

    A configured factory is called as `factory(model_path, **factory_kwargs)`; without
    one the model's config.json decides: the Qwen-VL packer for Qwen2.5-VL, the text
    packer for a model without a vision tower (its chat template, or the prompt as it
    is where the tokenizer has none), and a clear refusal for another vision-language
    family (which needs its own factory).
    """
    kwargs = dict(factory_kwargs or {})
    if factory:
        from configs.callables import import_callable

        build = import_callable(factory, key="data_packer.factory", trusted=trusted)
        try:
            packer = build(model_path, **kwargs)
        except TypeError as error:
            raise TypeError(
                f"data_packer.factory: {factory}(model_path, **{kwargs}) failed: {error}; a factory is called with "
                "the model path and data_packer.factory_kwargs"
            ) from None
        if not isinstance(packer, DataPacker):
            raise TypeError(
                f"data_packer.factory: {factory} returned {type(packer).__name__}, which lacks pack_prompts(prompts, "
                "sources) and decode_completions(response_ids, response_mask)"
            )
        return packer
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    if config.model_type in QWEN_VL_MODEL_TYPES:
        return qwen_vl_packer(model_path, **kwargs)
    if getattr(config, "vision_config", None) is not None:
        raise ValueError(
            f"data_packer.factory: the model at {model_path} is a {config.model_type!r} vision-language model and has "
            f"no built-in DataPacker (built in: {', '.join(sorted(QWEN_VL_MODEL_TYPES))}); set data_packer.factory "
            "(docs/howto/custom-datapacker.md)"
        )
    if kwargs:
        raise TypeError(f"data_packer.factory_kwargs: {sorted(kwargs)} given, but the text packer takes none")
    return text_packer(model_path)
