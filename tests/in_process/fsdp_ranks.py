"""Gloo ranks in spawned processes for the FSDP2 tests: each rank builds the same
small Qwen3 model, runs `UpdateRuntime` on its shard of a fixed batch, and writes
what the test compares (rank 0's gathered weights, the receipt metrics) to files.

Spawned with torch.multiprocessing rather than as Ray actors: a process group of two
costs about as much as two imports of torch, not a Ray cluster's start-up."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

SEQUENCE = 12
SAMPLES = 8


def small_qwen3(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config)


def batch() -> SimpleNamespace:
    """(SAMPLES, SEQUENCE) token ids, the same on every rank, as targets of the update
    runtime: a one-token "prompt" and every later token a trained response token."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 48, (SAMPLES, SEQUENCE), generator=generator)
    return SimpleNamespace(
        num_samples=SAMPLES, input_ids=ids, attention_mask=torch.ones_like(ids), prompt_length=1,
        response_mask=torch.ones(SAMPLES, SEQUENCE - 1), extras={},
    )


def language_model_loss(model: torch.nn.Module) -> Callable:
    """Next-token cross-entropy per response token (m, r'), for `UpdateRuntime.run_plan`."""
    from algorithm.ppo_math import masked_mean
    from models.model_io import response_logprobs

    def loss_fn(targets: SimpleNamespace, micro):
        ids, mask, prompt_length = micro.sequences(targets.input_ids, targets.attention_mask, targets.prompt_length)
        per_token = -response_logprobs(model, ids, mask, prompt_length)
        return per_token, {"loss": masked_mean(per_token, micro.response(targets.response_mask)).detach()}

    return loss_fn


def runtime(rank: int, world: int, address: str, lora_rank: int = 0):
    from configs.schema import OptimizerConfig
    from trainer.update_runtime import UpdateRuntime

    torch.set_num_threads(1)
    model = small_qwen3(seed=rank)  # rank 0's draw must win: the join broadcasts it
    if lora_rank:
        from configs.schema import LoraConfig
        from models.lora import add_adapters

        model = add_adapters(model, LoraConfig(rank=lora_rank), seed=rank)
    update = UpdateRuntime("policy", model, OptimizerConfig(max_grad_norm=0.5), lr=1e-2)
    if world > 1:
        update.join_data_parallel(address, rank, world)
    return update


def train(update, iterations: tuple[int, ...] = (1, 2)) -> list[dict[str, float]]:
    from algorithm.update_plan import UpdatePlan

    receipts = []
    for iteration in iterations:
        plan = UpdatePlan(epochs=2, minibatch_size=4, micro_batch_size=2, seed=3, outer_iteration=iteration)
        receipts.append(update.run_plan(plan, batch(), language_model_loss(update.model)))
    return receipts


def write_result(out: Path, rank: int, update, receipts: list[dict[str, float]], name: str = "weights") -> None:
    """Rank 0 writes the gathered full weights as `<name>.safetensors` (every rank
    must call: the gather is a collective)."""
    from safetensors.torch import save_file

    from trainer.sharding import full_weights

    weights = full_weights(update.model, keep=rank == 0)
    if rank == 0:
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, str(out / f"{name}.safetensors"))
        (out / f"{name}.json").write_text(json.dumps(receipts))


def train_ranks(rank: int, world: int, address: str, out: str, options: dict[str, Any]) -> None:
    """The spawned body: train, optionally with the gradient reduction switched off."""
    if not options.get("reduce", True):
        import trainer.update_runtime

        trainer.update_runtime.set_gradient_sync = lambda model, sync: trainer.sharding.set_gradient_sync(model, False)
    update = runtime(rank, world, address)
    receipts = train(update)
    write_result(Path(out), rank, update, receipts)
    shard_bytes = sum(p.to_local().numel() for p in update.model.parameters()) if world > 1 else None
    if rank == 0 and shard_bytes is not None:
        (Path(out) / "shard_numel.json").write_text(json.dumps(shard_bytes))
    if world > 1:
        torch.distributed.destroy_process_group()


# Each rank is forked from one stdlib forkserver that imported these once per test
# session, instead of importing torch and transformers itself (about 5 CPU-s a rank;
# issue 19). The forkserver is a fresh single-threaded process, so the ranks inherit
# none of the test process's threads (Ray's, Prefect's).
RANK_PRELOAD = ["torch", "transformers.modeling_utils", "tests.in_process.fsdp_ranks", "trainer.update_runtime"]


def spawn(body: Callable, world: int, out: Path, options: dict[str, Any] | None = None) -> None:
    import multiprocessing

    import torch.multiprocessing as mp

    from trainer.data_parallel import rendezvous_address

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out.mkdir(parents=True, exist_ok=True)
    multiprocessing.set_forkserver_preload(RANK_PRELOAD)
    mp.start_processes(
        body, args=(world, rendezvous_address(), str(out), options or {}), nprocs=world, join=True,
        start_method="forkserver",
    )


def save_and_continue(rank: int, world: int, address: str, out: str, options: dict[str, Any]) -> None:
    """A save before any step (`out/pristine`, S-CW-7), iteration 1, a sharded save
    into `out/boundary`, iteration 2: the uninterrupted run."""
    update = runtime(rank, world, address)
    update.save(f"{out}/pristine", {})
    if update.optimizer.state:  # materialising the state dict must have been rolled back
        raise AssertionError(f"rank {rank}: a pristine save left optimizer state behind")
    train(update, (1,))
    write_result(Path(out), rank, update, [], "after_1")
    update.save(f"{out}/boundary", {})
    write_result(Path(out), rank, update, train(update, (2,)), "uninterrupted")
    torch.distributed.destroy_process_group()


def resume_and_continue(rank: int, world: int, address: str, out: str, options: dict[str, Any]) -> None:
    """For each boundary in `options["boundaries"]`: load it into these ranks (either
    layout, any saving rank count), run iteration 2, write `<name>.safetensors`."""
    update = runtime(rank, world, address)
    for name, boundary in options["boundaries"].items():
        update.load(boundary)
        write_result(Path(out), rank, update, train(update, (2,)), name)
    torch.distributed.destroy_process_group()


def lora_save_and_resume(rank: int, world: int, address: str, out: str, options: dict[str, Any]) -> None:
    """LoRA adapters on sharded ranks: iteration 1, a sharded save into `out/boundary`,
    iteration 2 (`uninterrupted`); then the one-rank boundary `options["from_one"]`
    loaded into these ranks and iteration 2 again (`from_one`)."""
    update = runtime(rank, world, address, lora_rank=options["lora_rank"])
    train(update, (1,))
    update.save(f"{out}/boundary", {})
    write_result(Path(out), rank, update, train(update, (2,)), "uninterrupted")
    update.load(options["from_one"])
    write_result(Path(out), rank, update, train(update, (2,)), "from_one")
    torch.distributed.destroy_process_group()


def scored_trajectory(vocab_size: int):
    """A fixed batch of 4 sequences (prompt 5, response 4), the last rows padded, the
    same on every rank."""
    from contracts.trajectory import PromptBatch, Trajectory

    generator = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(0, vocab_size, (4, 5), generator=generator)
    response_ids = torch.randint(0, vocab_size, (4, 4), generator=generator)
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_mask[3, :2] = 0  # left padding
    response_mask = torch.ones(4, 4)
    response_mask[2, 3:] = 0.0  # ended early
    prompts = PromptBatch(
        iteration=1, prompts=["p"] * 4, references=[None] * 4, metadata=[{}] * 4, row_ids=[0, 1, 2, 3]
    )
    return Trajectory.one_turn(
        iteration=1, policy_version=0, prompts=prompts, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        response_ids=response_ids, response_mask=response_mask, rollout_logprobs=torch.zeros(4, 4),
        completions=[""] * 4,
    )


def score_reference(rank: int, world: int, address: str, out: str, options: dict[str, Any]) -> None:
    """The reference role body on `world` gloo ranks: join, shard, score the fixed
    batch; rank 0 writes the log-probs, every rank how many weight elements it holds."""
    from safetensors.torch import save_file

    from configs.loading import load_config
    from placement.plan import plan_placement
    from placement.role_placement import role_placements
    from roles.reference_role import ReferenceRole

    torch.set_num_threads(1)
    config = load_config(options["profile"], [f"model.path={options['model']}", f"grid.cpu_reference_ranks={world}"])
    reference = ReferenceRole(config, role_placements(plan_placement(config))["reference"][rank])
    if world > 1:
        assert reference.join_data_parallel(address, rank, world)["ranks"] == world
    scored, _ = reference.score(scored_trajectory(reference.model.config.vocab_size))
    held = [int(local_part(p).numel()) for p in reference.model.parameters()]
    grads = [p.requires_grad for p in reference.model.parameters()]
    (Path(out) / f"held_{rank}.json").write_text(json.dumps({"held": sum(held), "requires_grad": any(grads)}))
    if rank == 0:
        save_file({"ref_logprobs": scored.ref_logprobs.contiguous()}, str(Path(out) / "scored.safetensors"))
    if world > 1:
        torch.distributed.destroy_process_group()


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    from trainer.sharding import local_part as part

    return part(tensor)


# --- S-PATH-2: one minibatch's gradient, however it is cut -------------------------

PROMPT_LENGTHS = [5, 2, 3, 4, 1, 5, 2, 3]  # real prompt tokens per row, left-padded to 5
RESPONSE_LENGTHS = [6, 1, 4, 2, 6, 3, 5, 2]  # real response tokens per row, right-padded to 6
GENERATION_BUDGET = 6


def ragged_targets(model: torch.nn.Module):
    """PPO targets (float64) over 8 rows of different prompt and response lengths, the
    same on every rank: row 0 holds an observation token (attended, never trained),
    old log-probs are the model's own moved by noise so that some ratios clip."""
    from contracts.trajectory import PPOTargets
    from models.model_io import response_logprobs

    generator = torch.Generator().manual_seed(5)
    rows, p, r = len(PROMPT_LENGTHS), max(PROMPT_LENGTHS), max(RESPONSE_LENGTHS)
    attention = torch.zeros(rows, p + r, dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(PROMPT_LENGTHS, RESPONSE_LENGTHS)):
        attention[row, p - prompt : p + response] = 1
    input_ids = torch.randint(1, 48, (rows, p + r), generator=generator) * attention
    loss_mask = attention[:, p:].double()
    loss_mask[0, 2] = 0.0  # an observation inside row 0's episode
    with torch.no_grad():
        current = response_logprobs(model, input_ids, attention, p)
    noise = 0.3 * torch.randn(rows, r, generator=generator, dtype=torch.float64)
    return PPOTargets(
        batch_id="ragged", iteration=1, policy_version=0, input_ids=input_ids, attention_mask=attention,
        prompt_length=p, response_mask=loss_mask, old_logprobs=(current + noise) * loss_mask,
        old_values=torch.randn(rows, r, generator=generator, dtype=torch.float64) * loss_mask,
        advantages=torch.randn(rows, r, generator=generator, dtype=torch.float64) * loss_mask,
        returns=torch.randn(rows, r, generator=generator, dtype=torch.float64) * loss_mask,
    )


def role_loss(role: str, model: torch.nn.Module, packs_rows: bool = False, **options: Any) -> Callable:
    """The policy's or the critic's own `_loss`, on a stand-in for the role; `packs_rows`
    as a role whose attention kernel takes packed rows sets it; `options` set the PPO
    options of `rl` (S-OPT-1), each off otherwise."""
    from roles.critic_role import CriticRole
    from roles.policy_role import PolicyRole

    off = {"clip_ratio_high": None, "dual_clip": None, "entropy_coef": 0.0, "kl_estimator": "k1"}
    rl = SimpleNamespace(rollout=SimpleNamespace(temperature=1.0), clip_ratio=0.2, value_clip=0.2, **off | options)
    body = SimpleNamespace(model=model, rl=rl, packs_rows=packs_rows)
    loss = PolicyRole._loss if role == "policy" else CriticRole._loss
    return lambda targets, micro: loss(body, targets, micro)


def small_value_model(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3ForTokenClassification

    config = small_qwen3(seed).config
    config.num_labels = 1
    config.classifier_dropout = 0.0  # as models/model_io.py load_value_model: no random head in train mode
    torch.manual_seed(seed)
    return Qwen3ForTokenClassification(config)


def minibatch_gradient(update, targets, loss_fn, mode: str, micro_batch_size: int = 8,
                       micro_batch_tokens: int | None = None) -> dict[str, torch.Tensor]:
    """The gradient of the one minibatch of `targets` (8 rows), gathered whole on every
    rank. The runtime is built with lr 0 and no clipping, so the weights never move."""
    from algorithm.update_plan import UpdatePlan
    from trainer.sharding import local_part

    plan = UpdatePlan(
        1, 8, micro_batch_size, seed=3, outer_iteration=1, micro_batch_tokens=micro_batch_tokens,
        loss_aggregation=mode, generation_budget=GENERATION_BUDGET,
    )
    update.plan_shape = None  # one runtime measures several plans; a run could not
    update.run_plan(plan, targets, loss_fn)
    gradients = {}
    for name, parameter in update.model.named_parameters():
        grad = parameter.grad
        gradients[name] = grad.full_tensor() if local_part(grad) is not grad else grad.clone()
    return gradients


CUTS = {"micro1": (1, None), "micro2": (2, None), "micro4": (4, None), "whole": (8, None),
        "tokens11": (8, 11), "tokens16": (8, 16), "tokens25": (8, 25)}


def gradient_runtime(rank: int, world: int, address: str):
    from configs.schema import OptimizerConfig
    from trainer.update_runtime import UpdateRuntime

    torch.set_num_threads(1)
    model = small_qwen3(seed=0).double()
    update = UpdateRuntime("policy", model, OptimizerConfig(max_grad_norm=1e9), lr=0.0)
    if world > 1:
        update.join_data_parallel(address, rank, world)
    return update


def gradient_ranks(rank: int, world: int, address: str, out: str, options: dict[str, Any]) -> None:
    """The spawned body: the policy loss's minibatch gradient for every mode and cut in
    `options["cases"]` ([mode, cut name]), rank 0 writing `<mode>-<cut>.safetensors`."""
    from safetensors.torch import save_file

    targets = ragged_targets(small_qwen3(seed=0).double())  # before sharding: the same on every rank
    update = gradient_runtime(rank, world, address)
    loss_fn = role_loss("policy", update.model)
    for mode, cut in options["cases"]:
        gradients = minibatch_gradient(update, targets, loss_fn, mode, *CUTS[cut])
        if rank == 0:
            save_file({k: v.contiguous() for k, v in gradients.items()}, str(Path(out) / f"{mode}-{cut}.safetensors"))
    if world > 1:
        torch.distributed.destroy_process_group()
