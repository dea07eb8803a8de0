"""How much of the trainers' work is padding, and what cutting by tokens saves
(`rl.micro_batch_tokens`, S-PATH-3).

For each profile, two runs of the same iterations in this process (`flows.in_process`:
the role bodies, no Prefect or Ray), stepped in turn so a swing in the machine's load
hits both alike: with count-based micro-batches (`before`: `rl.micro_batch_tokens=null`,
the default and what every profile ran before) and with a token budget (`after`). It prints, per run, the
median over iterations 2.. of `perf/padding_fraction` (the padded share of the token
slots the trainers' forwards processed), of the train stage and of the whole
iteration, the after/before ratios, and the load average beside each timing.

    .venv/bin/python -m bench.padding                                   # every CPU profile, 6 iterations
    .venv/bin/python -m bench.padding --profiles configs/ppo_tiny_tools_cpu.py --iterations 10
    .venv/bin/python -m bench.padding --tokens 512 -- rl.batch_size=32   # overrides for both runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import dataclass

from bench.overrides import split_overrides
from cli.environment import apply_default_environment

PROFILES = (
    "configs/ppo_tiny_cpu.py",
    "configs/ppo_tiny_reverse_cpu.py",
    "configs/ppo_tiny_arith_cpu.py",
    "configs/ppo_tiny_vlm_cpu.py",
    "configs/ppo_tiny_rlhf_cpu.py",
    "configs/ppo_tiny_tools_cpu.py",
)


@dataclass
class Figures:
    padding: list[float]
    train_seconds: list[float]
    iteration_seconds: list[float]
    loads: list[float]

    def median(self, values: list[float]) -> float:
        return statistics.median(values[1:] or values)  # iteration 1 warms the allocator up


def _load() -> float:
    return os.getloadavg()[0]


def measure(profile: str, iterations: int, budget: int | None, overrides: list[str]) -> tuple[Figures, Figures]:
    """The profile with count-based micro-batches (`before`, today's default) and with
    `budget`, stepped alternately."""
    from configs.loading import load_config
    from flows.in_process import run_in_process
    from flows.in_process_roles import build_roles

    root = tempfile.mkdtemp(prefix="padding-")
    common = [f"rl.max_steps={iterations}", "rl.save_every=0", f"job.output_root={root}", *overrides]
    before = load_config(profile, [*common, "job.name=before", "rl.micro_batch_tokens=null"])
    after = load_config(profile, [*common, "job.name=after", f"rl.micro_batch_tokens={budget}"])
    runs = [(config, build_roles(config), Figures([], [], [], [])) for config in (before, after)]
    versions = [0, 0]
    for iteration in range(1, iterations + 1):
        for index, (config, roles, figures) in enumerate(runs):
            load = _load()
            records, _ = run_in_process(config, iteration, roles=roles, start=iteration)
            record = records[-1]
            versions[index] = int(record["train/policy_version"])
            figures.padding.append(record.get("perf/padding_fraction", float("nan")))
            figures.train_seconds.append(record["time/train_seconds"])
            figures.iteration_seconds.append(record["time/iteration_seconds"])
            figures.loads.append(load)
    return runs[0][2], runs[1][2]


def main(argv: list[str] | None = None) -> int:
    apply_default_environment()
    own, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=1024, help="rl.micro_batch_tokens of the `after` runs")
    args = parser.parse_args(own)
    print(f"rl.micro_batch_tokens={args.tokens} against null (count-based micro-batches); medians over iterations "
          f"2..{args.iterations}, in process; load average (1 min) at the start: {_load():.2f}", flush=True)
    for profile in args.profiles:
        before, after = measure(profile, args.iterations, args.tokens, overrides)
        name = profile.rsplit("/", 1)[-1].removesuffix(".py")
        train = (before.median(before.train_seconds), after.median(after.train_seconds))
        whole = (before.median(before.iteration_seconds), after.median(after.iteration_seconds))
        print(
            f"{name}: padding {before.median(before.padding):.1%} -> {after.median(after.padding):.1%}; "
            f"train {train[0]:.3f} s -> {train[1]:.3f} s ({train[1] / train[0]:.2f}x); "
            f"iteration {whole[0]:.3f} s -> {whole[1]:.3f} s ({whole[1] / whole[0]:.2f}x); "
            f"load {min(before.loads + after.loads):.2f}-{max(before.loads + after.loads):.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
