"""transformers `generate` as a rollout engine (CPU and small GPU runs)."""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

from data.packing import PackedPrompts
from models.model_io import load_causal_lm, logprobs_from_logits
from roles.rollout.engine import GenerationResult, response_mask_from_ids


class HFEngine:
    keeps_buckets = False  # each bucket is copied into the model before the next is fetched

    accepts_multimodal = True  # PackedPrompts.multimodal reaches `generate` (S-RUN-6)

    def __init__(self, model_path: str, dtype: str, eos_token_id: int, pad_token_id: int, device: str = "cpu"):
        self.device = torch.device(device)
        self.model = load_causal_lm(model_path, dtype).to(self.device).eval()
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id

    @torch.no_grad()
    def generate(
        self, prompts: PackedPrompts, *, max_new_tokens: int, temperature: float, seed: int, greedy: bool = False,
        stop_token_ids: tuple[int, ...] = (),
    ) -> GenerationResult:
        input_ids = prompts.input_ids.to(self.device)
        attention_mask = prompts.attention_mask.to(self.device)
        # Text packers add nothing here, so a text model's call is unchanged.
        extra: dict = {}
        never_generate: tuple[int, ...] = ()
        if prompts.multimodal is not None:
            extra = {k: v.to(self.device) for k, v in prompts.multimodal.forward_kwargs(input_ids.shape[1]).items()}
            never_generate = prompts.multimodal.never_generate
        if never_generate:
            extra["suppress_tokens"] = list(never_generate)
        ends = [self.eos_token_id, *stop_token_ids] if stop_token_ids else self.eos_token_id
        sampling: dict = {"do_sample": False}
        if not greedy:
            sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            # Seeded per iteration: a resumed run samples exactly what the
            # uninterrupted run sampled (S-CKPT-8). The fork keeps the process's own
            # stream untouched, so an evaluation between rollouts changes nothing (S-OPS-2).
            torch.manual_seed(seed)
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                **sampling,
                max_new_tokens=max_new_tokens,
                eos_token_id=ends,
                pad_token_id=self.pad_token_id,
                return_dict_in_generate=True,
                output_logits=True,
                **extra,
            )
        response_ids = output.sequences[:, input_ids.shape[1] :]
        # Raw logits, not `scores`: processed scores are not the sampling distribution.
        logits = torch.stack(output.logits, dim=1)
        logprobs = logprobs_from_logits(logits, response_ids, 1.0 if greedy else temperature, never_generate)
        response_mask = response_mask_from_ids(response_ids, ends)
        response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, self.pad_token_id))
        return GenerationResult(response_ids.cpu(), response_mask.cpu(), (logprobs * response_mask).cpu())

    def weight_names(self) -> list[str]:
        return list(self.model.state_dict())

    def load_weights(self, buckets: Iterable[Mapping[str, torch.Tensor]]) -> int:
        """Each bucket copied into the model's own tensors (the publication's manifest
        has already been checked to cover every weight exactly once)."""
        received = 0
        for bucket in buckets:
            result = self.model.load_state_dict(bucket, strict=False)
            if result.unexpected_keys:
                raise KeyError(f"the rollout model has no weight {result.unexpected_keys[0]!r}")
            received += sum(t.numel() * t.element_size() for t in bucket.values())
            del bucket  # the next bucket is fetched only after this one is released
        return received

    def sleep(self) -> None:
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        if self.device.type == "cuda":
            self.model.to(self.device)
