"""What durable commits cost (S-CKPT-9): the time of one full commit (both trainers'
saves with their re-read checks, the data cursor, the marker, the pointer, retention)
with every fsync as shipped, and again with `os.fsync` made a no-op in this process
(what the commit cost before its files were synced), for the CPU profile's tiny model
and for a model of about 1 GB (built locally with random weights, no download).

    python -m bench.commit_sync [--size tiny|1gb] [--repeats 5] [--root DIR]

Each repeat commits one boundary each way, alternately, after `os.sync()` so neither
starts with the other's unwritten pages. Medians with the load average go to
docs/performance.md ("Checkpoint commits"). The shipped default stays durable whatever this shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from checkpoint.boundary import boundary_path
from checkpoint.role_files import write_file
from checkpoint.role_state import save_trainable_role
from configs.schema import ModelConfig, TinyModelSpec
from models.model_io import ensure_model
from rundir.run_outputs import RunPaths
from tasks.commit import commit

SIZES = {
    "tiny": TinyModelSpec(task_alphabet="0123456789"),  # the CPU profile's
    # About 240M parameters: 0.96 GB of float32 weights, 1.9 GB of AdamW moments.
    "1gb": TinyModelSpec(task_alphabet="0123456789", hidden_size=1024, intermediate_size=4096,
                         num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=2),
}


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def _trainer(model: torch.nn.Module) -> dict[str, Any]:
    """The model with an AdamW that has stepped once, so its moments exist."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler}


@contextmanager
def fsync_off(off: bool) -> Iterator[None]:
    """Every fsync of this process a no-op, the commit's and the writers' alike."""
    real = os.fsync
    if off:
        os.fsync = lambda descriptor: None
    try:
        yield
    finally:
        os.fsync = real


def one_commit(run_dir: Path, iteration: int, roles: dict[str, dict[str, Any]]) -> float:
    paths = RunPaths(str(run_dir))
    paths.ensure()
    boundary = boundary_path(paths.checkpoints, iteration)
    started = time.perf_counter()
    saves = {}
    for role, trainer in roles.items():
        report = save_trainable_role(f"{boundary}/{role}", role=role, trainer_state={"optimizer_step": iteration},
                                     **trainer)
        saves[role] = {"optimizer_step": report.optimizer_step}
    write_file(f"{boundary}/data/cursor.json", json.dumps({"epoch": 0, "position": iteration, "shuffle_seed": 0}))
    commit(iteration, saves, boundary, paths.checkpoints, iteration, {}, None, {"iteration": iteration})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="ppo-commit-sync-", dir=args.root) as scratch:
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

        folder = ensure_model(ModelConfig(path=f"{scratch}/model", tiny=SIZES[args.size]))
        policy = AutoModelForCausalLM.from_pretrained(folder)
        critic = AutoModelForTokenClassification.from_pretrained(folder, num_labels=1)
        roles = {"policy": _trainer(policy), "critic": _trainer(critic)}
        weights = sum(p.numel() * p.element_size() for p in policy.parameters())
        print(f"size {args.size}: policy and critic {weights / 1e6:.1f} MB of weights each; load {_load()}")
        seconds: dict[str, list[float]] = {"durable": [], "fsync off": []}
        loads: dict[str, list[str]] = {"durable": [], "fsync off": []}
        for repeat in range(1, args.repeats + 1):
            for way in seconds:
                os.sync()
                with fsync_off(way == "fsync off"):
                    elapsed = one_commit(Path(scratch) / way.replace(" ", "-"), repeat, roles)
                seconds[way].append(elapsed)
                loads[way].append(_load())
                print(f"repeat {repeat} {way}: {elapsed:.3f} s (load {loads[way][-1]})", flush=True)
        for way, values in seconds.items():
            runs = ", ".join(f"{value:.3f}" for value in values)
            print(f"| {args.size} | {way} | {statistics.median(values):.3f} s | {runs} | "
                  f"{loads[way][0].split()[0]} -> {loads[way][-1].split()[0]} |")


if __name__ == "__main__":
    main()
