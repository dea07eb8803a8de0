"""Per-rank memory of an FSDP2-sharded trainer at 1, 2 and 4 gloo ranks (S-SCALE-1).

`python -m bench.fsdp_memory [--ranks 1 2 4] [--model-dir DIR]` builds a Qwen3 model
of about 100M parameters with the project's own tiny-model builder (wider and deeper
than the CPU profile's; nothing is downloaded), loads it through `load_causal_lm` like
every role, and in each of N spawned ranks runs one update of `UpdateRuntime` (the
trainers' runtime, sharded by `join_data_parallel`). Each rank then reports the bytes
it holds of parameters, gradients and AdamW state, and its peak and current resident
memory. The sharded share should fall as 1/N; the peak does not, because each rank
still loads the whole model from disk before sharding it (docs/performance.md, "An
FSDP2-sharded trainer, per rank").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

SPEC = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=4, max_position_embeddings=256)


def build(model_dir: str) -> str:
    from configs.schema import ModelConfig, TinyModelSpec
    from models.model_io import ensure_model

    return ensure_model(ModelConfig(path=model_dir, tiny=TinyModelSpec(**SPEC)))


def _current_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _bytes(tensors) -> int:
    from trainer.sharding import local_part

    return sum(local_part(t).numel() * local_part(t).element_size() for t in tensors)


def rank_body(rank: int, world: int, address: str, model_dir: str, out: str) -> None:
    from types import SimpleNamespace

    from algorithm.update_plan import UpdatePlan
    from configs.schema import OptimizerConfig
    from models.model_io import load_causal_lm, response_logprobs
    from trainer.update_runtime import UpdateRuntime

    torch.set_num_threads(1)
    update = UpdateRuntime("policy", load_causal_lm(model_dir, "float32"), OptimizerConfig(), lr=1e-5)
    if world > 1:
        update.join_data_parallel(address, rank, world)
    ids = torch.randint(0, update.model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))

    def loss_fn(targets, micro):  # next-token cross-entropy per token (m, r), the runtime's LossFn
        rows = micro.rows
        return -response_logprobs(update.model, targets.input_ids[rows], targets.attention_mask[rows], 1), {}

    targets = SimpleNamespace(
        num_samples=4, input_ids=ids, attention_mask=torch.ones_like(ids), prompt_length=1,
        response_mask=torch.ones(4, ids.shape[1] - 1), extras={},
    )
    update.run_plan(UpdatePlan(1, 4, 4 // world, 0, 1), targets, loss_fn)
    parameters = list(update.model.parameters())
    state = [v for s in update.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    row = {
        "rank": rank,
        "world": world,
        "parameters": sum(p.numel() for p in parameters),
        "param_bytes": _bytes(parameters),
        "grad_bytes": _bytes([p.grad for p in parameters if p.grad is not None]),
        "optimizer_bytes": _bytes(state),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_bytes": _current_rss_bytes(),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(row))
    if world > 1:
        torch.distributed.destroy_process_group()


def measure(world: int, model_dir: str) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    from trainer.data_parallel import rendezvous_address

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_body, args=(world, rendezvous_address(), model_dir, out), nprocs=world, join=True)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def _mib(value: int) -> str:
    return f"{value / 2**20:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fsdp_memory", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "ppo-bench-qwen3-100m"))
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model_dir = build(args.model_dir)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"model: {model_dir} ({json.dumps(SPEC)})")
    print(f"load before: {load}")
    print("| ranks | parameters | params MiB/rank | grads MiB/rank | AdamW state MiB/rank | sharded total MiB/rank "
          "| peak RSS MiB (max rank) | RSS after update MiB (max rank) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world in args.ranks:
        rows = measure(world, model_dir)
        worst = max(rows, key=lambda r: r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"])
        total = worst["param_bytes"] + worst["grad_bytes"] + worst["optimizer_bytes"]
        print(f"| {world} | {worst['parameters']:,} | {_mib(worst['param_bytes'])} | {_mib(worst['grad_bytes'])} | "
              f"{_mib(worst['optimizer_bytes'])} | {_mib(total)} | {_mib(max(r['peak_rss_bytes'] for r in rows))} | "
              f"{_mib(max(r['rss_bytes'] for r in rows))} |", flush=True)
    print(f"load after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
