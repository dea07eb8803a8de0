"""The reward stage with a learned reward model against the rule reward, on this machine.

Two figures per reward: samples per second of `RewardRole.score` on one batch of the
copy-digit task (repeated, the median kept), and the reward stage's share of a whole
iteration in a short in-process run of the tiny profile (time/reward_seconds over
time/iteration_seconds, the mean over the iterations after the first). Prints the
load average before and after, since a shared machine's figures mean little without it.

    .venv/bin/python -m bench.reward_stage [--batch 64] [--repeats 5] [--iterations 4]

On a GPU node (the reward model beside the reference, grid.reward_placement=with_reference):

    .venv/bin/python -m bench.reward_stage --profile configs/ppo_qwen06b_public_4gpu.py \\
        --reward-model /models/my-reward-model --iterations 3 -- grid.gpus_per_node=4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

RLHF_PROFILE = "configs/ppo_tiny_rlhf_cpu.py"


def _trajectory(batch: int, seed: int = 0):
    from contracts.trajectory import PromptBatch, Trajectory

    rng = random.Random(seed)
    prompts = [str(rng.randrange(10)) for _ in range(batch)]
    completions = [str(rng.randrange(10)) for _ in range(batch)]
    rows = PromptBatch(1, prompts, list(prompts), [{}] * batch, list(range(batch)))
    return Trajectory.one_turn(
        iteration=1, policy_version=0, prompts=rows,
        prompt_ids=torch.ones(batch, 2, dtype=torch.long), prompt_mask=torch.ones(batch, 2, dtype=torch.long),
        response_ids=torch.ones(batch, 1, dtype=torch.long), response_mask=torch.ones(batch, 1),
        rollout_logprobs=torch.zeros(batch, 1), completions=completions,
    )


def samples_per_second(config, batch: int, repeats: int) -> float:
    from roles.reward_role import RewardRole

    role = RewardRole(config)
    trajectory = _trajectory(batch)
    role.score(trajectory)  # warm: the first forward allocates
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        role.score(trajectory)
        seconds.append(time.perf_counter() - started)
    return batch / statistics.median(seconds)


def stage_share(config, iterations: int, root: str) -> tuple[float, float]:
    """(reward-stage share of the iteration, mean reward-stage seconds) over iterations 2..N."""
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths

    config = config.model_copy(update={"job": config.job.model_copy(update={"output_root": root})})
    run_in_process(config, paths=RunPaths.for_config(config))
    rows = [json.loads(line) for line in open(Path(root) / config.job.name / "metrics.jsonl")]
    rows = [row for row in rows if row["iteration"] >= 2]
    shares = [row["time/reward_seconds"] / row["time/iteration_seconds"] for row in rows]
    return statistics.mean(shares), statistics.mean(row["time/reward_seconds"] for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=RLHF_PROFILE)
    parser.add_argument("--reward-model", default=None, help="rl.reward.model.path (default: the profile's)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from configs.loading import load_config

    common = ["rl.validation=null", "job.trackers=[]", "job.experience.keep=off", "rl.save_every=0",
              "rl.save_final=false", f"rl.max_steps={args.iterations}", f"rl.batch_size={args.batch}",
              *args.overrides]
    model_key = [f"rl.reward.model.path={args.reward_model}"] if args.reward_model else []
    with_model = load_config(args.profile, [*common, *model_key])
    with_rule = load_config(args.profile, [*common, "rl.reward.model=null"])
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"torch threads {torch.get_num_threads()}, batch {args.batch}")
    results = {}
    for label, config in (("rule", with_rule), ("model", with_model)):
        rate = samples_per_second(config, args.batch, args.repeats)
        with tempfile.TemporaryDirectory(prefix="ppo-bench-reward-") as root:
            share, seconds = stage_share(config, args.iterations, root)
        results[label] = (rate, share, seconds)
        print(f"{label:5s}: {rate:9.1f} samples/s in RewardRole.score; reward stage {seconds:.3f} s, "
              f"{share:.1%} of the iteration (iterations 2..{args.iterations})")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
