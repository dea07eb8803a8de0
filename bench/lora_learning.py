"""Does LoRA learn like full fine-tuning? The arithmetic profile, a few seeds each.

`python -m bench.lora_learning [--seeds 0,1,2] [--iterations 20] [--variant LABEL=OVERRIDES ...]`
runs `configs/ppo_tiny_arith_cpu.py` in process (`flows.in_process`, the same
computation as the flow) for each variant and seed, and prints the held-out exact
match (`val/exact_match`, every held-out sum, greedy) before training and after the
last iteration, and the mean training reward of the last 5 iterations. A variant is a
label and its overrides separated by spaces, e.g.
`--variant "r8 lr3e-3=model.lora.rank=8 rl.optimizer.policy_lr=3e-3"`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROFILE = "configs/ppo_tiny_arith_cpu.py"
# The policy learning rates of the table in docs/performance.md "LoRA against full
# fine-tuning": the profile's for full fine-tuning, 1e-3 for LoRA (the best of 3e-4, 1e-3
# and 3e-3 on seed 0 for rank 8; rank 64's best there, 3e-3, collapsed on another seed).
DEFAULT_VARIANTS = (
    "full=",
    "r8 lr1e-3=model.lora.rank=8 rl.optimizer.policy_lr=1e-3",
    "r64 lr1e-3=model.lora.rank=64 rl.optimizer.policy_lr=1e-3",
)


def run(overrides: list[str], seed: int, iterations: int, root: str) -> dict[str, float]:
    from configs.loading import load_config
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths

    config = load_config(PROFILE, [
        f"job.output_root={root}", f"job.name=s{seed}", f"job.seed={seed}", f"rl.max_steps={iterations}",
        f"rl.validation.every={iterations}", "rl.save_every=0", "job.trackers=[]", *overrides,
    ])
    started = time.perf_counter()
    run_in_process(config, paths=RunPaths.for_config(config), resume=False)
    records = [json.loads(line) for line in (Path(root) / f"s{seed}" / "metrics.jsonl").read_text().splitlines()]
    evaluated = {r["iteration"]: r["val/exact_match"] for r in records if "val/exact_match" in r}
    rewards = [r["train/reward_mean"] for r in records if "train/reward_mean" in r]
    return {"before": evaluated[0], "after": evaluated[iterations], "reward_last5": statistics.mean(rewards[-5:]),
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lora_learning", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--variant", action="append", help="LABEL=OVERRIDES (repeatable)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"profile {PROFILE}, {args.iterations} iterations, seeds {seeds}; load average {os.getloadavg()}")
    print("| variant | seed | held-out exact before | after | train reward, last 5 | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for variant in args.variant or DEFAULT_VARIANTS:
        label, _, overrides = variant.partition("=")
        afters = []
        for seed in seeds:
            with tempfile.TemporaryDirectory() as root:
                result = run(overrides.split(), seed, args.iterations, root)
            afters.append(result["after"])
            print(f"| {label} | {seed} | {result['before']:.3f} | {result['after']:.3f} | "
                  f"{result['reward_last5']:.3f} | {result['seconds']:.0f} |", flush=True)
        print(f"| {label} | mean | | {statistics.mean(afters):.3f} | | |", flush=True)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
