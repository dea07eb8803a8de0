"""What the orchestration costs: the same PPO iterations run two ways in one process.

(a) `flows.in_process`: the same iteration program on the role bodies in this process,
    no Prefect, no Ray (one process, one torch thread, trainers one after the other);
(b) the real `ppo` flow: Prefect tasks over long-lived Ray actors (trainers in
    parallel, each actor on one torch thread).

Same profile, seed and sizes; checkpoint commits are off in both (they are storage,
not orchestration). For each batch size it prints the median per-stage time of both,
the orchestration overhead per iteration and as a fraction of the flow's iteration
wall time, and the bytes the flow process itself received from Ray per iteration.

Overhead is measured against the *critical path* of the direct loop: its stages with
the two trainers counted as the slower of the two (what the flow's parallel train
stage could at best achieve on this machine), so the flow's parallelism cannot hide
its costs. Three views say where the overhead goes: the in-flow split (stage wall
time minus the compute the actor itself reports, for rollout and train), the CPU
seconds per iteration of each process group (flow process, Prefect server, Ray
daemons, actors; `bench.cpu_accounting`), and a probe of the unit costs (a no-op
Prefect task, a no-op actor call, one trajectory hop through an actor).

    .venv/bin/python -m bench.overhead                         # CPU profile, batch 64 and 256
    .venv/bin/python -m bench.overhead --iterations 12 --repeats 3 --json overhead.json
    # without Ray's zero-copy tensors (on by default):
    RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=0 .venv/bin/python -m bench.overhead
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from bench.cpu_accounting import CpuSampler
from cli.environment import apply_default_environment
from contracts.stage_names import EVALUATE, SAVE_ARTIFACT_TASK, TIMED_STAGES

DEFAULT_PROFILE = "configs/ppo_tiny_cpu.py"
# The timed stages of every iteration (commits are off here; evaluation runs on its own cadence).
STAGES = tuple(stage for stage in TIMED_STAGES if stage not in ("commit", SAVE_ARTIFACT_TASK, EVALUATE))


@dataclass
class RayGetMeter:
    """Counts what `ray.get` hands to this process from inside the stage tasks: the
    flow's own receipts, summaries and metrics. Size is the pickle (protocol 5) size of
    the returned value, i.e. roughly what crossed into the flow process."""

    calls: int = 0
    bytes: int = 0
    largest: int = 0
    by_caller: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def installed(self) -> Iterator["RayGetMeter"]:
        import ray

        original = ray.get

        def metered_get(object_refs, *args, **kwargs):
            value = original(object_refs, *args, **kwargs)
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("tasks."):
                size = len(pickle.dumps(value, protocol=5))
                self.calls += 1
                self.bytes += size
                self.largest = max(self.largest, size)
                stage = stage_function()
                self.by_caller[stage] = self.by_caller.get(stage, 0) + size
            return value

        ray.get = metered_get
        try:
            yield self
        finally:
            ray.get = original


def stage_function() -> str:
    """The stage the bytes belong to: the running Prefect task's name without its
    iteration (`rollout[iter=3]` -> `rollout`), else the direct caller's name."""
    from prefect.runtime import task_run

    name = task_run.name
    return name.split("[", 1)[0] if name else sys._getframe(2).f_code.co_name


def sized_overrides(profile: str, batch_size: int, iterations: int, extra: list[str]) -> list[str]:
    """The profile at another batch size: minibatch and micro-batch scale with it, so
    the number of optimizer steps per iteration stays the profile's."""
    from configs.loading import load_config

    rl = load_config(profile, extra).rl
    scale = batch_size / rl.batch_size
    minibatch = max(1, int(rl.minibatch_size * scale))
    micro = max(1, int(rl.micro_batch_size * scale))
    return [
        f"rl.batch_size={batch_size}",
        f"rl.minibatch_size={minibatch}",
        f"rl.micro_batch_size={micro}",
        f"rl.max_steps={iterations}",
        "rl.save_every=0",
        "rl.save_final=false",
        "rl.validation=null",  # evaluation runs on its own cadence, not in every iteration measured here
        *extra,
    ]


def run_direct_once(profile: str, overrides: list[str]) -> tuple[list[dict[str, Any]], list[float]]:
    """Records, and the monotonic time at which each iteration ended."""
    from flows.in_process import build_roles, run_in_process
    from configs.loading import load_config

    config = load_config(profile, overrides)
    roles = build_roles(config)
    ended: list[float] = []
    try:
        return run_in_process(config, roles=roles, on_iteration=lambda _: ended.append(time.monotonic()))[0], ended
    finally:
        del roles
        gc.collect()


@contextmanager
def watch_lines(path: str) -> Iterator[list[float]]:
    """Monotonic times at which `path` gained each line (the flow appends one metrics
    record per finished iteration), polled from a thread every 20 ms."""
    import threading

    ended: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        seen = 0
        while not stop.wait(0.02):
            try:
                with open(path, "rb") as handle:
                    lines = handle.read().count(b"\n")
            except OSError:
                continue
            now = time.monotonic()
            ended.extend([now] * (lines - seen))
            seen = max(seen, lines)

    thread = threading.Thread(target=poll, name="metrics-watch", daemon=True)
    thread.start()
    try:
        yield ended
    finally:
        stop.set()
        thread.join()


def run_flow_once(
    profile: str, overrides: list[str], output_root: str, name: str
) -> tuple[list[dict[str, Any]], RayGetMeter, list[float]]:
    from flows.training import ppo
    from rundir.run_outputs import read_metrics

    meter = RayGetMeter()
    metrics_path = f"{output_root}/{name}/metrics.jsonl"
    with meter.installed(), watch_lines(metrics_path) as ended:
        ppo(profile=profile, overrides=[*overrides, f"job.output_root={output_root}"], run_name=name, resume=False)
    return read_metrics(metrics_path), meter, ended


def cpu_per_iteration(sampler: CpuSampler, ended: list[float], skip: int) -> dict[str, float]:
    """CPU seconds per iteration and process group, over iterations skip+1..last."""
    if len(ended) <= skip + 1 or skip < 1:
        return {}
    totals = sampler.window_cpu(ended[skip - 1], ended[-1])
    iterations = len(ended) - skip
    return {group: seconds / iterations for group, seconds in totals.items()}


def stage_ms(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return 1000 * statistics.median(values) if values else None


def critical_path_seconds(record: dict[str, Any]) -> float:
    """Direct-loop iteration with the trainers counted as the slower one."""
    trainers = [record.get("perf/policy_train_seconds", 0.0), record.get("perf/critic_train_seconds", 0.0)]
    return record["time/iteration_seconds"] - record["time/train_seconds"] + max(trainers)


@dataclass
class SizeResult:
    batch_size: int
    iterations_measured: int
    direct_stage_ms: dict[str, float]
    flow_stage_ms: dict[str, float]
    direct_iteration_ms: float
    direct_critical_path_ms: float
    flow_iteration_ms: float
    overhead_ms: float
    overhead_fraction: float
    overhead_ms_per_repeat: list[float]
    rollout_orchestration_ms: float
    train_orchestration_ms: float
    flow_bytes_per_iteration: float
    flow_ray_gets_per_iteration: float
    flow_largest_get_bytes: int
    flow_bytes_by_task: dict[str, float]
    metrics_identical: bool
    direct_cpu_ms: dict[str, float]
    flow_cpu_ms: dict[str, float]


def measure_size(
    profile: str, batch_size: int, iterations: int, repeats: int, skip: int, extra: list[str], output_root: str
) -> SizeResult:
    overrides = sized_overrides(profile, batch_size, iterations, extra)
    direct_runs, flow_runs, meters = [], [], []
    direct_cpu, flow_cpu = [], []
    for repeat in range(repeats):
        print(f"  batch {batch_size}, repeat {repeat + 1}/{repeats}: direct loop ...", flush=True)
        sampler = CpuSampler().start()
        records, ended = run_direct_once(profile, overrides)
        sampler.stop()
        direct_runs.append(records)
        direct_cpu.append(cpu_per_iteration(sampler, ended, skip))
        print(f"  batch {batch_size}, repeat {repeat + 1}/{repeats}: flow ...", flush=True)
        sampler = CpuSampler().start()
        records, meter, ended = run_flow_once(
            profile, overrides, output_root, f"overhead-b{batch_size}-r{repeat}-{os.getpid()}"
        )
        sampler.stop()
        flow_runs.append(records)
        meters.append(meter)
        flow_cpu.append(cpu_per_iteration(sampler, ended, skip))
    # The first iterations pay one-off costs (lazy imports, allocator warm-up) in both.
    direct = [r for run in direct_runs for r in run if r["iteration"] > skip]
    flow = [r for run in flow_runs for r in run if r["iteration"] > skip]
    direct_stage = {s: stage_ms(direct, f"time/{s}_seconds") for s in STAGES}
    flow_stage = {s: stage_ms(flow, f"time/{s}_seconds") for s in STAGES}
    critical = 1000 * statistics.median(critical_path_seconds(r) for r in direct)
    flow_iteration = stage_ms(flow, "time/iteration_seconds")
    per_repeat = []
    for direct_run, flow_run in zip(direct_runs, flow_runs):
        d = 1000 * statistics.median(critical_path_seconds(r) for r in direct_run if r["iteration"] > skip)
        f = 1000 * statistics.median(r["time/iteration_seconds"] for r in flow_run if r["iteration"] > skip)
        per_repeat.append(f - d)
    rollout_orchestration = statistics.median(
        1000 * (r["time/rollout_seconds"] - r["rollout/generate_seconds"]) for r in flow
    )
    train_orchestration = statistics.median(
        1000 * (r["time/train_seconds"] - max(r.get("perf/policy_train_seconds", 0.0), r["perf/critic_train_seconds"]))
        for r in flow
    )
    total_iterations = sum(len(run) for run in flow_runs)
    by_task: dict[str, float] = {}
    for meter in meters:
        for name, size in meter.by_caller.items():
            by_task[name] = by_task.get(name, 0.0) + size / total_iterations
    overhead = flow_iteration - critical
    return SizeResult(
        batch_size=batch_size,
        iterations_measured=len(flow),
        direct_stage_ms=direct_stage,
        flow_stage_ms=flow_stage,
        direct_iteration_ms=stage_ms(direct, "time/iteration_seconds"),
        direct_critical_path_ms=critical,
        flow_iteration_ms=flow_iteration,
        overhead_ms=overhead,
        overhead_fraction=overhead / flow_iteration,
        overhead_ms_per_repeat=per_repeat,
        rollout_orchestration_ms=rollout_orchestration,
        train_orchestration_ms=train_orchestration,
        flow_bytes_per_iteration=sum(m.bytes for m in meters) / total_iterations,
        flow_ray_gets_per_iteration=sum(m.calls for m in meters) / total_iterations,
        flow_largest_get_bytes=max(m.largest for m in meters),
        flow_bytes_by_task=by_task,
        metrics_identical=same_metrics(direct_runs[0], flow_runs[0]),
        direct_cpu_ms=median_by_key(direct_cpu),
        flow_cpu_ms=median_by_key(flow_cpu),
    )


def median_by_key(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Median over repeats of each group's CPU seconds per iteration, in ms."""
    keys = sorted({k for d in dicts for k in d})
    return {k: 1000 * statistics.median(d[k] for d in dicts if k in d) for k in keys}


def same_metrics(direct: list[dict[str, Any]], flow: list[dict[str, Any]]) -> bool:
    """The two ways are the same computation: every non-timing metric must agree."""
    if len(direct) != len(flow):
        return False
    for d, f in zip(direct, flow):
        keys = {k for k in d if not k.startswith("time/") and not k.endswith("_seconds")}
        flow_keys = {k for k in f if not k.startswith("time/") and not k.endswith("_seconds")}
        if keys != flow_keys or any(d[k] != f[k] for k in keys):
            return False
    return True


# -- unit costs ---------------------------------------------------------------------


def probe_unit_costs(profile: str, samples: int = 40) -> dict[str, float]:
    """Median cost in ms of the pieces a stage is made of, measured in this process."""
    import dataclasses

    import ray
    from prefect import flow, get_run_logger, task

    from flows.in_process import build_roles
    from configs.loading import load_config
    from tasks.prefect_tasks import STAGE_TASK

    config = load_config(profile, [])
    roles = build_roles(config)
    prompts, _ = roles.data.next_batch(1, config.rl.batch_size, config.rl.rollout.samples_per_prompt)
    trajectory, _ = roles.rollout.generate(prompts, 0)
    trajectory, _ = roles.reward.score(trajectory)
    del roles
    gc.collect()

    @ray.remote(num_cpus=0)
    class Hop:
        def noop(self) -> int:
            return 0

        def replace(self, trajectory):
            return dataclasses.replace(trajectory), {"ok": 1.0}

    @task(name="probe", task_run_name="probe[{i}]", **STAGE_TASK)
    def empty_task(i: int) -> int:
        return i

    @task(name="probe_logged", task_run_name="probe_logged[{i}]", **STAGE_TASK)
    def logged_task(i: int) -> int:
        get_run_logger().info("train/reward_mean=0.5, train/kl=0.01, critic/value_mean=0.2")
        return i

    def timed_ms(fn) -> float:
        fn()
        values = []
        for _ in range(samples):
            t0 = time.perf_counter()
            fn()
            values.append(1000 * (time.perf_counter() - t0))
        return statistics.median(values)

    hop = Hop.remote()
    trajectory_ref = ray.put(trajectory)

    @flow(name="overhead-probe", persist_result=False)
    def probe_flow() -> dict[str, float]:
        return {
            "prefect_task_ms": timed_ms(lambda: empty_task(0)),
            "prefect_task_with_log_ms": timed_ms(lambda: logged_task(0)),
            "ray_noop_call_ms": timed_ms(lambda: ray.get(hop.noop.remote())),
            "ray_trajectory_hop_ms": timed_ms(
                lambda: ray.get(hop.replace.options(num_returns=2).remote(trajectory_ref)[1])
            ),
            "pickle_trajectory_roundtrip_ms": timed_ms(lambda: pickle.loads(pickle.dumps(trajectory, protocol=5))),
        }

    try:
        return probe_flow()
    finally:
        ray.kill(hop)


# -- report -------------------------------------------------------------------------


def print_report(result: SizeResult) -> None:
    print(f"\nbatch {result.batch_size}: medians over {result.iterations_measured} flow iterations")
    print(f"  {'stage':<16}{'direct ms':>11}{'flow ms':>10}{'flow-direct':>13}")
    for stage in STAGES:
        d, f = result.direct_stage_ms[stage], result.flow_stage_ms[stage]
        if d is None or f is None:
            continue
        print(f"  {stage:<16}{d:>11.1f}{f:>10.1f}{f - d:>+13.1f}")
    print(f"  direct iteration {result.direct_iteration_ms:.1f} ms (trainers in sequence); "
          f"critical path {result.direct_critical_path_ms:.1f} ms (slower trainer only)")
    print(f"  flow iteration   {result.flow_iteration_ms:.1f} ms")
    print(f"  orchestration overhead {result.overhead_ms:.1f} ms/iteration = "
          f"{100 * result.overhead_fraction:.1f} % of the flow's iteration wall time "
          f"(per repeat: {', '.join(f'{v:.0f}' for v in result.overhead_ms_per_repeat)} ms)")
    print(f"  in-flow split: rollout stage minus generate {result.rollout_orchestration_ms:.1f} ms; "
          f"train stage minus slower trainer {result.train_orchestration_ms:.1f} ms")
    print(f"  flow process received {result.flow_bytes_per_iteration:.0f} B/iteration in "
          f"{result.flow_ray_gets_per_iteration:.1f} ray.get calls "
          f"(largest single value {result.flow_largest_get_bytes} B)")
    print("  bytes per iteration by task: " + ", ".join(
        f"{name.removesuffix('_stage')} {size:.0f}" for name, size in sorted(result.flow_bytes_by_task.items())))
    print(f"  metrics identical between direct loop and flow: {result.metrics_identical}")
    busy = {}
    for label, cpu in (("direct", result.direct_cpu_ms), ("flow", result.flow_cpu_ms)):
        groups = {group: ms for group, ms in cpu.items() if group != "wall"}
        if groups:
            busy[label] = sum(groups.values())
            parts = ", ".join(f"{group} {ms:.0f}" for group, ms in sorted(groups.items(), key=lambda kv: -kv[1]))
            print(f"  CPU ms per iteration, {label}: {busy[label]:.0f} in all ({parts}) "
                  f"over {cpu.get('wall', float('nan')):.0f} ms wall")
    if len(busy) == 2:
        print(f"  the flow burns {busy['flow'] - busy['direct']:.0f} CPU-ms per iteration more than the direct loop "
              f"({busy['flow'] / busy['direct']:.2f}x)")


def tuning_environment() -> dict[str, str]:
    """The settings that change what this benchmark measures, as set in this process
    (the ephemeral Prefect server and the Ray workers inherit them)."""
    prefixes = ("PREFECT_SERVER_SERVICES_", "PREFECT_LOGGING_TO_API", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS")
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument(
        "--batch-sizes", default="64,256", help="comma-separated rl.batch_size values (first: the profile's)"
    )
    parser.add_argument("--iterations", type=int, default=12, help="iterations per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind per batch size (medians pool them)")
    parser.add_argument("--skip", type=int, default=2, help="first iterations of each run left out of the medians")
    parser.add_argument("--no-probe", action="store_true", help="skip the unit-cost probe")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for both ways")
    args = parser.parse_args(argv)
    apply_default_environment()
    from processes.ray_session import init_ray, prepare_ray_auth

    prepare_ray_auth(joins_cluster=False)  # the local Ray's token, before anything imports Ray
    from configs.loading import load_config

    config = load_config(args.profile, args.overrides)
    init_ray(num_cpus=config.grid.ray_num_cpus)  # once: every flow run below joins it
    print(f"overhead: {args.profile}, {args.iterations} iterations x {args.repeats} repeats per way, "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"tuning in the environment: {', '.join(f'{k}={v}' for k, v in tuning_environment().items()) or 'none'}",
          flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="ppo-overhead-") as output_root:
        for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
            result = measure_size(
                args.profile, batch_size, args.iterations, args.repeats, args.skip, args.overrides, output_root
            )
            print_report(result)
            results.append(result)
    probe = None if args.no_probe else probe_unit_costs(args.profile)
    if probe:
        print("\nunit costs (median ms): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in probe.items()))
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"profile": args.profile, "results": [asdict(r) for r in results], "unit_costs": probe,
                       "environment": tuning_environment(), "cpus": os.cpu_count()},
                      handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
