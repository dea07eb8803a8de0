"""How much faster is one step off? The same profile run synchronously and one step off.

Each run goes through the command line (`python -m flows.ppo --config PROFILE -- ...`:
Ray and a temporary Prefect API start per run), in its own output root and job.name,
with checkpoints and evaluation off so that only training is timed; with `--repeats`
the two modes alternate, so a change in the machine's load hits both. From each run's
metrics.jsonl it prints the per-stage median times and the median
`time/iteration_seconds` over the measured iterations (by default 3..12), their ratio
(sync / one step off), and the shortest iteration the overlap could reach here, the
largest of:

- the CPU work of an iteration (CPU seconds of every process the run started, read
  from /proc while it runs) over the machine's cores, and the role actors' over the
  CPUs Ray has: an iteration cannot be shorter than the time the cores need for it;
- the busiest single role (a role actor computes on one torch thread);
- the two chains of the synchronous run that one step off runs side by side:
  generation (rollout + reward) and training (reference_score .. weight_sync).

It also reports the CPU that processes outside the run took meanwhile (/proc/stat),
so a figure taken on a shared machine says what it competed with.

One step off, row N+1's `time/rollout_seconds` runs from the start of its rollout at
the beginning of iteration N until the controller collected it after N's training:
not the generation's own time, which is `rollout/generate_seconds` ("engine generate").

    .venv/bin/python -m bench.async_speedup --repeats 5          # configs/ppo_tiny_reverse_cpu.py, 12 iterations
    .venv/bin/python -m bench.async_speedup -- rl.batch_size=64 rl.minibatch_size=64 rl.micro_batch_size=64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from bench.cpu_accounting import CpuSampler, _cmdline
from contracts.stage_names import TIMED_STAGES, time_key

from bench.overrides import split_overrides

DEFAULT_PROFILE = "configs/ppo_tiny_reverse_cpu.py"
MODES = {"sync": 0, "one step off": 1}
GENERATION_CHAIN = ("rollout", "reward")
TRAINING_CHAIN = ("reference_score", "critic_predict", "prepare_batch", "train", "weight_sync")


class RoleCpuSampler(CpuSampler):
    """CpuSampler that also names each Ray worker by its actor class (`ray::PolicyRole`),
    so the CPU of every role can be told apart."""

    def __init__(self) -> None:
        super().__init__()
        self.roles: dict[int, str] = {}
        # CPU seconds the whole machine had spent busy, and lost to the hypervisor (steal), at each sample
        self.machine: list[tuple[float, float]] = []

    def _sample(self, root: int) -> None:
        super()._sample(root)
        self.machine.append(machine_cpu_seconds())
        for pid in self.samples[-1][1]:
            if pid not in self.roles:
                title = _cmdline(pid)
                # Role actors are titled `ray::<role>:<Class>`; Ray's own agents have no role.
                name = title[len("ray::") :].split(".", 1)[0].split(" ", 1)[0] if title.startswith("ray::") else ""
                if ":" in name:
                    self.roles[pid] = name.split(":", 1)[0]

    def others_cpu(self, start: float, end: float) -> tuple[float, float]:
        """CPU seconds that processes outside the run (other users of the machine) spent
        between two monotonic times, the machine's busy time less the run's own; and the
        seconds the hypervisor took from this VM (steal)."""
        inside = [i for i, (t, _) in enumerate(self.samples) if start <= t <= end]
        if len(inside) < 2:
            return 0.0, 0.0
        (busy_0, steal_0), (busy_1, steal_1) = self.machine[inside[0]], self.machine[inside[-1]]
        ours = sum(seconds for group, seconds in self.window_cpu(start, end).items() if group != "wall")
        return max(0.0, busy_1 - busy_0 - ours), steal_1 - steal_0

    def role_cpu(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per role actor between two monotonic times."""
        inside = [cpu for t, cpu in self.samples if start <= t <= end]
        totals: dict[str, float] = {}
        if len(inside) < 2:
            return totals
        for pid, role in self.roles.items():
            seen = [cpu[pid] for cpu in inside if pid in cpu]
            if len(seen) >= 2:
                totals[role] = totals.get(role, 0.0) + seen[-1] - seen[0]
        return totals


def machine_cpu_seconds() -> tuple[float, float]:
    """CPU seconds all cores have spent busy since boot (/proc/stat: user, nice, system,
    irq, softirq), and those the hypervisor stole."""
    with open("/proc/stat") as handle:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, handle.readline().split()[1:9])
    ticks = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / ticks, steal / ticks


@contextmanager
def watch_iterations(path: Path) -> Iterator[list[tuple[float, float]]]:
    """(monotonic time, 1-minute load average) at which `path` gained each line: the
    run appends one metrics row per finished iteration. Polled every 20 ms."""
    ended: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        seen = 0
        while not stop.wait(0.02):
            try:
                lines = path.read_bytes().count(b"\n")
            except OSError:
                continue
            if lines > seen:
                ended.extend([(time.monotonic(), os.getloadavg()[0])] * (lines - seen))
                seen = lines

    thread = threading.Thread(target=poll, name="metrics-watch", daemon=True)
    thread.start()
    try:
        yield ended
    finally:
        stop.set()
        thread.join()


@dataclass
class RunResult:
    """One run of one mode: its measured metrics rows and what the sampler saw."""

    records: list[dict[str, Any]]  # the measured iterations' metrics rows
    cpu_ms: dict[str, float]  # per process group, per measured iteration; "wall" is the window's
    role_cpu_ms: dict[str, float]  # per role actor, per measured iteration
    others_ms: float  # CPU of processes outside the run, per measured iteration
    steal_ms: float  # CPU the hypervisor took from this VM, per measured iteration
    load: list[float]  # 1-minute load average at the end of each measured iteration
    wall_seconds: float


def run_once(
    profile: str, mode: str, max_staleness: int, iterations: int, skip: int, extra: list[str], root: Path, repeat: int
) -> RunResult:
    name = f"async-speedup-{max_staleness}-r{repeat}"
    output_root = root / name
    overrides = [
        f"rl.max_steps={iterations}",
        "rl.save_every=0",
        "rl.save_final=false",
        "rl.validation=null",  # training only: no evaluate[iter=N] rows
        f"rl.rollout.max_staleness={max_staleness}",
        f"job.output_root={output_root}",
        f"job.name={name}",
        *extra,
    ]
    command = [sys.executable, "-m", "flows.ppo", "--config", profile, "--", *overrides]
    metrics_path = output_root / name / "metrics.jsonl"
    log_path = root / f"{name}.log"
    print(f"  {mode}, run {repeat + 1}: {' '.join(command[1:])} (log {log_path}), "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    started = time.perf_counter()
    sampler = RoleCpuSampler()
    with open(log_path, "w") as log, watch_iterations(metrics_path) as ended:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        sampler.start(process.pid)
        returncode = process.wait()
        sampler.stop()
    wall = time.perf_counter() - started
    if returncode != 0:
        tail = log_path.read_text().splitlines()[-30:]
        raise SystemExit(f"error: the {mode} run exited {returncode}; the end of {log_path}:\n" + "\n".join(tail))
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    measured = [r for r in records if r["iteration"] > skip]
    if len(ended) != len(records) or len(ended) <= skip:
        raise SystemExit(f"error: saw {len(ended)} rows appear in {metrics_path} but it holds {len(records)}")
    window = (ended[skip - 1][0], ended[-1][0])  # from the end of iteration `skip` to the end of the last
    per_iteration = 1000 / len(measured)
    others, steal = sampler.others_cpu(*window)
    return RunResult(
        records=measured,
        cpu_ms={group: seconds * per_iteration for group, seconds in sampler.window_cpu(*window).items()},
        role_cpu_ms={role: seconds * per_iteration for role, seconds in sampler.role_cpu(*window).items()},
        others_ms=others * per_iteration,
        steal_ms=steal * per_iteration,
        load=[load for _, load in ended[skip:]],
        wall_seconds=wall,
    )


@dataclass
class ModeResult:
    """One mode over all its runs: stage times are medians over every measured
    iteration of every run; CPU figures are medians over the runs."""

    mode: str
    max_staleness: int
    runs: int
    iterations_measured: int
    stage_ms: dict[str, float]
    iteration_ms: float
    iteration_ms_per_run: list[float]
    generate_ms: float  # the engine's own generation time (rollout/generate_seconds)
    cpu_ms: dict[str, float]
    role_cpu_ms: dict[str, float]
    others_ms: float
    steal_ms: float
    load: list[float]
    wall_seconds: list[float]


def pooled(mode: str, max_staleness: int, runs: list[RunResult]) -> ModeResult:
    rows = [r for run in runs for r in run.records]
    stages = [s for s in TIMED_STAGES if any(time_key(s) in r for r in rows)]

    def median_ms(key: str) -> float:
        return 1000 * statistics.median(r[key] for r in rows if key in r)

    def median_of(dicts: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(d.get(k, 0.0) for d in dicts) for k in sorted({k for d in dicts for k in d})}

    return ModeResult(
        mode=mode,
        max_staleness=max_staleness,
        runs=len(runs),
        iterations_measured=len(rows),
        stage_ms={s: median_ms(time_key(s)) for s in stages},
        iteration_ms=median_ms("time/iteration_seconds"),
        iteration_ms_per_run=[1000 * statistics.median(r["time/iteration_seconds"] for r in run.records)
                              for run in runs],
        generate_ms=median_ms("rollout/generate_seconds"),
        cpu_ms=median_of([run.cpu_ms for run in runs]),
        role_cpu_ms=median_of([run.role_cpu_ms for run in runs]),
        others_ms=statistics.median(run.others_ms for run in runs),
        steal_ms=statistics.median(run.steal_ms for run in runs),
        load=[load for run in runs for load in run.load],
        wall_seconds=[run.wall_seconds for run in runs],
    )


@dataclass
class Bound:
    cpu_all_ms: float  # every process of the run, over the machine's cores
    cpu_actors_ms: float  # the role actors only, over the cores Ray has
    busiest_role: str
    busiest_role_ms: float
    generation_chain_ms: float  # sync medians: rollout + reward
    training_chain_ms: float  # sync medians: reference_score .. weight_sync
    bound_ms: float
    best_speedup: float


def overlap_bound(sync: ModeResult, off: ModeResult, ray_cpus: int) -> Bound:
    """The shortest iteration one step off could reach here: the largest of the floors
    in this module's docstring, each taken from the runs just made."""
    cpu_all = sum(ms for group, ms in off.cpu_ms.items() if group != "wall") / (os.cpu_count() or ray_cpus)
    cpu_actors = sum(off.role_cpu_ms.values()) / ray_cpus
    busiest_role, busiest_ms = max(off.role_cpu_ms.items(), key=lambda kv: kv[1], default=("none", 0.0))
    generation = sum(sync.stage_ms.get(s, 0.0) for s in GENERATION_CHAIN)
    training = sum(sync.stage_ms.get(s, 0.0) for s in TRAINING_CHAIN)
    bound = max(cpu_all, cpu_actors, busiest_ms, generation, training)
    return Bound(cpu_all, cpu_actors, busiest_role, busiest_ms, generation, training, bound, sync.iteration_ms / bound)


def load_range(loads: list[float]) -> str:
    return f"load {min(loads):.1f}-{max(loads):.1f}" if loads else "load ?"


def print_report(sync: ModeResult, off: ModeResult, bound: Bound, ray_cpus: int, first: int, last: int) -> None:
    print(f"\nmedians over iterations {first}-{last} of {sync.runs} run(s) per mode (ms); "
          f"one step off, row N+1's rollout ran during N")
    print(f"  {'stage':<18}{'sync':>10}{'one step off':>14}")
    for stage in TIMED_STAGES:
        if stage in sync.stage_ms or stage in off.stage_ms:
            print(f"  {stage:<18}{sync.stage_ms.get(stage, float('nan')):>10.1f}"
                  f"{off.stage_ms.get(stage, float('nan')):>14.1f}")
    print(f"  {'(engine generate)':<18}{sync.generate_ms:>10.1f}{off.generate_ms:>14.1f}")
    print(f"  {'iteration':<18}{sync.iteration_ms:>10.1f}{off.iteration_ms:>14.1f}")
    for result in (sync, off):
        print(f"  {result.mode}: iteration median per run "
              f"{', '.join(f'{ms:.0f}' for ms in result.iteration_ms_per_run)} ms, {load_range(result.load)}")
    for result in (sync, off):
        groups = ", ".join(f"{g} {ms:.0f}" for g, ms in sorted(result.cpu_ms.items(), key=lambda kv: -kv[1])
                           if g != "wall")
        roles = ", ".join(f"{r} {ms:.0f}" for r, ms in sorted(result.role_cpu_ms.items(), key=lambda kv: -kv[1]))
        print(f"  CPU ms per iteration, {result.mode}: {groups} (wall {result.cpu_ms.get('wall', 0):.0f}); "
              f"roles: {roles}; other processes on the machine {result.others_ms:.0f}, "
              f"hypervisor steal {result.steal_ms:.0f}")
    ratio = sync.iteration_ms / off.iteration_ms
    print(f"\nspeed-up sync / one step off: {sync.iteration_ms:.0f} / {off.iteration_ms:.0f} ms = {ratio:.2f}x "
          f"(sync {load_range(sync.load)}, one step off {load_range(off.load)})")
    print(f"overlap bound on this machine ({os.cpu_count()} cores, Ray {ray_cpus} CPUs), one step off: "
          f"all CPU work / cores {bound.cpu_all_ms:.0f} ms, actors' CPU / Ray CPUs {bound.cpu_actors_ms:.0f} ms, "
          f"busiest role {bound.busiest_role} {bound.busiest_role_ms:.0f} ms, sync generation chain "
          f"{bound.generation_chain_ms:.0f} ms, sync training chain {bound.training_chain_ms:.0f} ms "
          f"-> bound {bound.bound_ms:.0f} ms, best speed-up {bound.best_speedup:.2f}x")
    within = off.iteration_ms / bound.bound_ms - 1
    print(f"target: >= 1.25x {'met' if ratio >= 1.25 else 'NOT met'} ({ratio:.2f}x); within 15 % of the bound "
          f"{'met' if within <= 0.15 else 'NOT met'} (one step off is {100 * within:.0f} % above it)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.async_speedup", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--iterations", type=int, default=12, help="rl.max_steps of each run")
    parser.add_argument("--skip", type=int, default=2, help="first iterations left out of the medians")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per mode, alternating sync and one step off (medians pool them)"
    )
    parser.add_argument("--out", default="outputs/bench/async_speedup", help="folder for the runs and their logs")
    parser.add_argument("--json", help="also write the figures here")
    argv, extra = split_overrides(argv)
    args = parser.parse_args(argv)
    if args.skip < 1 or args.iterations <= args.skip:
        parser.error("need 1 <= --skip < --iterations")

    from configs.loading import load_config

    config = load_config(args.profile, extra)
    from models.model_io import ensure_model

    ensure_model(config.model)  # a tiny model's pre-training, once, outside the timed runs
    ray_cpus = config.grid.ray_num_cpus or os.cpu_count() or 1
    root = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    print(f"async speed-up: {args.profile} {' '.join(extra)}, {args.repeats} run(s) x {args.iterations} iterations "
          f"per mode, iterations {args.skip + 1}-{args.iterations} measured; {os.cpu_count()} cores, Ray {ray_cpus} "
          f"CPUs; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    runs: dict[str, list[RunResult]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):  # alternating, so a change in the machine's load hits both modes
        for mode, staleness in MODES.items():
            runs[mode].append(run_once(args.profile, mode, staleness, args.iterations, args.skip, extra, root, repeat))
    results = {mode: pooled(mode, MODES[mode], mode_runs) for mode, mode_runs in runs.items()}
    sync, off = results["sync"], results["one step off"]
    bound = overlap_bound(sync, off, ray_cpus)
    print_report(sync, off, bound, ray_cpus, args.skip + 1, args.iterations)
    print(f"wall time per run: sync {', '.join(f'{s:.0f}' for s in sync.wall_seconds)} s, one step off "
          f"{', '.join(f'{s:.0f}' for s in off.wall_seconds)} s; load average at end {os.getloadavg()[0]:.1f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"profile": args.profile, "overrides": extra, "ray_cpus": ray_cpus,
                       "results": {m: asdict(r) for m, r in results.items()}, "bound": asdict(bound)},
                      handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
