"""Does it learn? A profile run for N iterations under several seeds, as a curve.

Writes `reward_curve.png` (mean reward per iteration with the min–max spread over
seeds; critic-warmup iterations shaded), `reward_curve.csv` (one row per seed and
iteration) and prints the first-10 and last-10 mean reward of every seed.

By default the iterations run through `flows.in_process` (the role bodies in one
process: the same computation as the flow, metric for metric, and faster on a small
machine); `--flow` runs the real `ppo` flow over Ray actors instead.

    .venv/bin/python -m bench.learning                              # CPU profile, 3 seeds, 40 iterations
    .venv/bin/python -m bench.learning --seeds 0,1,2,3 --iterations 60 --out docs/images
    .venv/bin/python -m bench.learning --profile configs/ppo_tiny_arith_cpu.py --flow
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_PROFILE = "configs/ppo_tiny_cpu.py"
WINDOW = 10
CSV_KEYS = (
    "train/reward_mean",
    "train/kl",
    "train/value_loss",
    "train/explained_variance",
    "rollout/response_length_mean",
)


def run_seed(
    profile: str, seed: int, iterations: int | None, overrides: list[str], use_flow: bool, output_root: str
) -> list[dict[str, Any]]:
    seeded = [*overrides, f"job.seed={seed}"] + ([f"rl.max_steps={iterations}"] if iterations else [])
    if use_flow:
        from flows.training import ppo
        from rundir.run_outputs import read_metrics

        name = f"learning-seed{seed}-{os.getpid()}"
        ppo(
            profile=profile,
            overrides=[*seeded, f"job.output_root={output_root}", "rl.save_every=0", "rl.save_final=false"],
            run_name=name,
            resume=False,
        )
        return training_rows(read_metrics(f"{output_root}/{name}/metrics.jsonl"))
    from flows.in_process import run_in_process
    from configs.loading import load_config

    config = load_config(profile, seeded)
    return training_rows(run_in_process(
        config,
        on_iteration=lambda r: print(f"    iter {r['iteration']:>4}  reward {r['train/reward_mean']:.3f}", flush=True)
        if r["iteration"] % 10 == 0 and "train/reward_mean" in r else None,
    )[0])


def training_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curve is the training reward: the before-training evaluation's row 0 has none."""
    return [record for record in records if "train/reward_mean" in record]


def first_last(rewards: list[float], window: int = WINDOW) -> tuple[float, float]:
    return statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])


def write_csv(path: Path, runs: dict[int, list[dict[str, Any]]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["seed", "iteration", *CSV_KEYS])
        for seed, records in runs.items():
            for record in records:
                writer.writerow([seed, record["iteration"], *(record.get(key, "") for key in CSV_KEYS)])


def plot(path: Path, runs: dict[int, list[dict[str, Any]]], warmup: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    iterations = sorted({r["iteration"] for records in runs.values() for r in records})
    by_iteration = {
        i: [r["train/reward_mean"] for records in runs.values() for r in records if r["iteration"] == i]
        for i in iterations
    }
    mean = [statistics.fmean(by_iteration[i]) for i in iterations]
    low = [min(by_iteration[i]) for i in iterations]
    high = [max(by_iteration[i]) for i in iterations]
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    if warmup:
        axes.axvspan(0.5, warmup + 0.5, color="0.85", label=f"critic warmup ({warmup} it.)")
    axes.fill_between(iterations, low, high, alpha=0.3, color="tab:blue", label=f"min–max over {len(runs)} seeds")
    axes.plot(iterations, mean, color="tab:blue", linewidth=2, label="mean reward")
    axes.set_xlabel("PPO iteration")
    axes.set_ylabel("mean reward of the batch (train/reward_mean)")
    axes.set_ylim(-0.02, 1.02)
    axes.set_xlim(iterations[0] - 0.5, iterations[-1] + 0.5)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated job.seed values (default 3 seeds)")
    parser.add_argument(
        "--iterations", type=int, default=None, help="iterations per seed (default: the profile's rl.max_steps)"
    )
    parser.add_argument(
        "--flow", action="store_true", help="run the real ppo flow (Prefect + Ray) instead of the direct loop"
    )
    parser.add_argument(
        "--out", default="outputs/bench/learning", help="folder for reward_curve.png and reward_curve.csv"
    )
    parser.add_argument("--name", default="reward_curve", help="file stem of the PNG and CSV")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides")
    args = parser.parse_args(argv)

    from cli.environment import apply_default_environment

    apply_default_environment()
    from configs.loading import load_config

    config = load_config(args.profile, args.overrides)
    seeds = [int(s) for s in args.seeds.split(",")]
    iterations = args.iterations or config.rl.max_steps
    if args.flow:
        from processes.ray_session import init_ray

        init_ray(num_cpus=config.grid.ray_num_cpus)  # once for all seeds
    way = "ppo flow (Prefect + Ray actors)" if args.flow else "direct loop (flows.in_process, no Prefect/Ray)"
    print(f"learning: {args.profile}, {iterations} iterations x seeds {seeds}, through the {way}", flush=True)
    runs: dict[int, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="ppo-learning-") as output_root:
        for seed in seeds:
            started = time.perf_counter()
            print(f"  seed {seed} ...", flush=True)
            runs[seed] = run_seed(args.profile, seed, iterations, args.overrides, args.flow, output_root)
            rewards = [r["train/reward_mean"] for r in runs[seed]]
            first, last = first_last(rewards)
            print(f"  seed {seed}: reward first-{WINDOW} mean {first:.3f} -> last-{WINDOW} mean {last:.3f} "
                  f"(rise {last - first:+.3f}) in {time.perf_counter() - started:.0f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / f"{args.name}.csv", runs)
    title = f"{Path(args.profile).stem}: {len(seeds)} seeds, {'flow' if args.flow else 'direct loop'}"
    plot(out / f"{args.name}.png", runs, config.rl.critic_warmup_iterations, title)
    rises = [
        first_last([r["train/reward_mean"] for r in records])[1]
        - first_last([r["train/reward_mean"] for r in records])[0]
        for records in runs.values()
    ]
    print(f"rise (last-{WINDOW} minus first-{WINDOW}) per seed: {', '.join(f'{x:+.3f}' for x in rises)}; "
          f"median {statistics.median(rises):+.3f}")
    print(f"wrote {out / (args.name + '.png')} and {out / (args.name + '.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
