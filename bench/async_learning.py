"""Does one step off learn as well as synchronous PPO? Paired seeds, held-out exact match.

For each seed the profile runs twice in this process (`flows.in_process`: the same
iteration program and metrics as the flow), synchronously (`rl.rollout.max_staleness=0`)
and one step off (`=1`), and the held-out `val/exact_match` that the profile's
`evaluate[iter=N]` task measures is read at iteration 0 (the pre-trained start, the
same for both) and at the last iteration. Prints one row per seed with the paired
difference (one step off minus synchronous), then its mean and standard deviation.

    .venv/bin/python -m bench.async_learning                            # arith profile, seeds 0-4, 20 iterations
    .venv/bin/python -m bench.async_learning --seeds 0,1 --iterations 10 --json outputs/bench/async_learning.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_PROFILE = "configs/ppo_tiny_arith_cpu.py"
MODES = {"sync": 0, "one step off": 1}


@dataclass
class ModeRun:
    seed: int
    max_staleness: int
    start_exact_match: float
    final_exact_match: float
    final_policy_version: float | None
    last5_reward_mean: float
    staleness_seen: list[float]
    behaviour_weight_mean: float | None
    wall_seconds: float
    load_before: float
    load_after: float


def load_average() -> float:
    return os.getloadavg()[0]


def run_mode(profile: str, seed: int, iterations: int, max_staleness: int, extra: list[str]) -> ModeRun:
    from configs.loading import load_config
    from flows.in_process import run_in_process

    config = load_config(
        profile,
        [f"job.seed={seed}", f"rl.max_steps={iterations}", f"rl.rollout.max_staleness={max_staleness}", *extra],
    )
    load_before = load_average()
    started = time.perf_counter()
    records, _ = run_in_process(config)
    wall = time.perf_counter() - started
    evaluations = {r["iteration"]: r for r in records if "val/exact_match" in r}
    if 0 not in evaluations or iterations not in evaluations:
        raise SystemExit(
            f"error: no val/exact_match at iteration 0 and {iterations} (found {sorted(evaluations)}); "
            f"the profile's rl.validation must evaluate before training and at iteration {iterations}"
        )
    rewards = [r["train/reward_mean"] for r in records if "train/reward_mean" in r]
    weights = [r["train/behaviour_weight_mean"] for r in records if "train/behaviour_weight_mean" in r]
    return ModeRun(
        seed=seed,
        max_staleness=max_staleness,
        start_exact_match=evaluations[0]["val/exact_match"],
        final_exact_match=evaluations[iterations]["val/exact_match"],
        final_policy_version=evaluations[iterations].get("val/policy_version"),
        last5_reward_mean=statistics.fmean(rewards[-5:]),
        staleness_seen=sorted({r["rollout/staleness"] for r in records if "rollout/staleness" in r}),
        behaviour_weight_mean=statistics.fmean(weights) if weights else None,
        wall_seconds=wall,
        load_before=load_before,
        load_after=load_average(),
    )


def print_table(runs: dict[int, dict[str, ModeRun]], iterations: int) -> None:
    print(f"\nheld-out exact match after {iterations} iterations (iteration 0 is the pre-trained start)")
    print(f"  {'seed':>4}{'start':>8}{'sync':>8}{'1-off':>8}{'1-off - sync':>14}"
          f"{'reward sync/1-off (last 5)':>29}{'wall s sync/1-off':>20}{'load':>12}")
    differences = []
    for seed, pair in runs.items():
        sync, off = pair["sync"], pair["one step off"]
        difference = off.final_exact_match - sync.final_exact_match
        differences.append(difference)
        loads = [sync.load_before, sync.load_after, off.load_before, off.load_after]
        print(f"  {seed:>4}{sync.start_exact_match:>8.3f}{sync.final_exact_match:>8.3f}{off.final_exact_match:>8.3f}"
              f"{difference:>+14.3f}{sync.last5_reward_mean:>18.3f} / {off.last5_reward_mean:.3f}"
              f"{sync.wall_seconds:>13.0f} / {off.wall_seconds:<5.0f}{min(loads):>6.1f}-{max(loads):.1f}")
    spread = statistics.stdev(differences) if len(differences) > 1 else float("nan")
    for mode in MODES:
        finals = [pair[mode].final_exact_match for pair in runs.values()]
        gains = [pair[mode].final_exact_match - pair[mode].start_exact_match for pair in runs.values()]
        print(f"  {mode}: mean {statistics.fmean(finals):.3f} (gain {statistics.fmean(gains):+.3f}), "
              f"standard deviation over seeds {statistics.stdev(finals) if len(finals) > 1 else float('nan'):.3f}")
    print(f"  paired difference (one step off - sync): mean {statistics.fmean(differences):+.3f}, "
          f"standard deviation {spread:.3f} over {len(differences)} seeds "
          f"(standard error {spread / len(differences) ** 0.5:.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.async_learning", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated job.seed values")
    parser.add_argument("--iterations", type=int, default=20, help="rl.max_steps of every run")
    parser.add_argument("--json", help="also write every run's figures here (rewritten after each run)")
    parser.add_argument(
        "--report", nargs="+", metavar="JSON", help="print the table of earlier --json files; run nothing")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for both modes")
    args = parser.parse_args(argv)
    if args.report:
        runs, iterations = read_json(args.report)
        print_table(runs, iterations)
        return 0

    from cli.environment import apply_default_environment

    apply_default_environment()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"async learning: {args.profile}, {args.iterations} iterations, seeds {seeds}, sync and one step off "
          f"in process; load average at start {load_average():.1f} on {os.cpu_count()} CPUs", flush=True)
    started = time.perf_counter()
    runs: dict[int, dict[str, ModeRun]] = {}
    for seed in seeds:
        for mode, staleness in MODES.items():
            run = run_mode(args.profile, seed, args.iterations, staleness, args.overrides)
            runs.setdefault(seed, {})[mode] = run
            print(f"  seed {seed} {mode:<12}: exact match {run.start_exact_match:.3f} -> {run.final_exact_match:.3f} "
                  f"(evaluated by policy version {run.final_policy_version}), staleness seen {run.staleness_seen}, "
                  f"{run.wall_seconds:.0f} s, load {run.load_before:.1f} -> {run.load_after:.1f}", flush=True)
            if args.json:
                write_json(args.json, args.profile, args.iterations, runs)
    print_table(runs, args.iterations)
    print(f"wall time {(time.perf_counter() - started) / 60:.1f} min; load average at end {load_average():.1f}")
    return 0


def read_json(paths: list[str]) -> tuple[dict[int, dict[str, ModeRun]], int]:
    runs: dict[int, dict[str, ModeRun]] = {}
    iterations = set()
    for path in paths:
        with open(path) as handle:
            payload = json.load(handle)
        iterations.add(payload.get("iterations", 20))  # files written before the key was added ran 20
        for seed, pair in payload["runs"].items():
            runs[int(seed)] = {mode: ModeRun(**run) for mode, run in pair.items()}
    if len(iterations) != 1:
        raise SystemExit(f"error: the files ran different numbers of iterations ({sorted(iterations)})")
    return runs, iterations.pop()


def write_json(path: str, profile: str, iterations: int, runs: dict[int, dict[str, ModeRun]]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    payload: dict[str, Any] = {
        "profile": profile,
        "iterations": iterations,
        "runs": {str(seed): {mode: asdict(run) for mode, run in pair.items()} for seed, pair in runs.items()},
    }
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    sys.exit(main())
