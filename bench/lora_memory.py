"""What LoRA saves per trainer (S-LORA-2): full fine-tuning vs `model.lora.rank` r.

`python -m bench.lora_memory [--model wide|fsdp] [--ranks 0 8 16 64]` builds a Qwen3
with the project's tiny-model builder (`wide`: hidden 256, MLP 1024, 4 layers, as the
LoRA tests; `fsdp`: the 103.9M model of bench/fsdp_memory.py), and for each rank, in a
process of its own, loads the policy and the critic the way their roles do
(`load_causal_lm` / `load_value_model`, then `add_adapters`), runs one update of
`UpdateRuntime` on a fixed batch so AdamW's state exists, and saves a boundary
through the roles' own save code. It prints, per role and rank: parameters, trainable
parameters, AdamW state bytes in memory, the boundary's model and optimizer file
bytes, the bytes one weight-sync version publishes, and the process's peak resident
memory; with the load average, since the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

MODELS = {
    "wide": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4),
    "fsdp": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4, max_position_embeddings=256),
}


def build(model: str, model_dir: str) -> str:
    from configs.schema import ModelConfig, TinyModelSpec
    from models.model_io import ensure_model

    return ensure_model(ModelConfig(path=model_dir, tiny=TinyModelSpec(**MODELS[model])))


def measure(role: str, model_dir: str, rank: int) -> dict[str, float]:
    """One role at one LoRA rank (0: full fine-tuning), in this process."""
    from types import SimpleNamespace

    from algorithm.update_plan import UpdatePlan
    from configs.schema import LoraConfig, OptimizerConfig
    from models.lora import add_adapters, trainable_parameters
    from models.model_io import load_causal_lm, load_value_model
    from trainer.sharding import full_weight_buckets
    from trainer.update_runtime import UpdateRuntime

    torch.manual_seed(0)
    if role == "policy":
        model = load_causal_lm(model_dir, "float32")
    else:
        model = load_value_model(model_dir, "float32", seed=0)
    if rank:
        extra = {"task_type": "CAUSAL_LM"} if role == "policy" else {"modules_to_save": ["score"]}
        model = add_adapters(model, LoraConfig(rank=rank), seed=0, **extra)
    runtime = UpdateRuntime(role, model, OptimizerConfig(), lr=1e-4)
    ids = torch.randint(0, 40, (8, 32), generator=torch.Generator().manual_seed(1))

    def loss_fn(targets, micro):
        logits = runtime.model(input_ids=targets.input_ids[micro.rows]).logits
        return logits.float().pow(2).mean(dim=-1), {}  # any per-token loss: one step, so every AdamW moment exists

    plan = UpdatePlan(epochs=1, minibatch_size=8, micro_batch_size=8, seed=0, outer_iteration=1)
    targets = SimpleNamespace(
        num_samples=8, input_ids=ids, attention_mask=torch.ones_like(ids), prompt_length=0,
        response_mask=torch.ones(8, ids.shape[1]), extras={},
    )
    runtime.run_plan(plan, targets, loss_fn)
    optimizer_bytes = sum(
        value.numel() * value.element_size()
        for state in runtime.optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)
    )
    with tempfile.TemporaryDirectory() as boundary:
        runtime.save(boundary, {})
        files = {name: (Path(boundary) / name).stat().st_size for name in os.listdir(boundary)}
    buckets = [] if role == "critic" else full_weight_buckets(runtime.model, keep=True)
    published = sum(t.numel() * t.element_size() for bucket in buckets for t in bucket.values())
    return {
        "parameters": sum(p.numel() for p in runtime.model.parameters()),
        "trainable": trainable_parameters(runtime.model),
        "optimizer_state_bytes": optimizer_bytes,
        "boundary_model_bytes": files.get("model.safetensors", 0),
        "boundary_optimizer_bytes": files.get("optimizer.pt", 0),
        "weight_sync_bytes": published,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lora_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="wide")
    parser.add_argument("--ranks", type=int, nargs="+", default=[0, 8, 16, 64])
    parser.add_argument("--model-dir", default=None, help="where the model is built (default: a temporary folder)")
    parser.add_argument("--one", nargs=3, metavar=("ROLE", "MODEL_DIR", "RANK"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        role, model_dir, rank = args.one
        torch.set_num_threads(1)
        print(json.dumps(measure(role, model_dir, int(rank))))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build(args.model, args.model_dir or f"{scratch}/{args.model}")
        print(f"model {args.model} ({MODELS[args.model]}); load average before: {os.getloadavg()}")
        print("| role | LoRA rank | parameters | trainable | AdamW state MiB | boundary model MiB | "
              "boundary optimizer MiB | weight sync MiB / version | peak RSS MiB |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for role in ("policy", "critic"):
            for rank in args.ranks:
                # A process per measurement: the peak resident memory is that configuration's alone.
                line = subprocess.run(
                    [sys.executable, "-m", "bench.lora_memory", "--one", role, model_dir, str(rank)],
                    check=True, capture_output=True, text=True,
                ).stdout.strip().splitlines()[-1]
                m = json.loads(line)
                sync = _mib(m["weight_sync_bytes"]) if role == "policy" else "-"
                print(f"| {role} | {rank or 'full'} | {m['parameters']:,} | {m['trainable']:,} | "
                      f"{_mib(m['optimizer_state_bytes'])} | {_mib(m['boundary_model_bytes'])} | "
                      f"{_mib(m['boundary_optimizer_bytes'])} | {sync} | {_mib(m['peak_rss_bytes'])} |", flush=True)
        print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
