"""What one lost rollout engine costs a run: elastic rollout against today's
fail-and-auto-resume (S-ELASTIC-1).

For each engine count, three runs of the same config in one Ray and one temporary
Prefect API, each with fresh role actors (no kept processes, as a real run starts):

- undisturbed, elastic rollout on;
- elastic: engine 1 SIGKILLs itself inside `generate` of iteration `--kill-at`; the
  fleet regenerates its shard on a survivor and starts a replacement, which it waits
  for at its next call (that iteration's weight sync);
- today: `rl.rollout.max_engine_replacements=0` and `auto_resume_attempts=1`, the
  same kill: the rollout stage fails, every actor is stopped and started again, and
  the run resumes from the last committed boundary.

It prints each run's wall time and its difference to the undisturbed run's (noisy on a
shared machine: whole runs of a few seconds), the killed iteration's own
`time/iteration_seconds`, `time/rollout_seconds` and `time/weight_sync_seconds`
against the undisturbed run's, the replacement's `fault/rollout_replace_seconds` (in
the next row), and /proc/loadavg before and after each engine count, so a figure
taken on a shared machine says what it competed with.

    .venv/bin/python -m bench.elastic_rollout                    # 2 and 4 engines, 3 repeats, the CPU profile
    .venv/bin/python -m bench.elastic_rollout --engines 2 -- rl.batch_size=32
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PROFILE = "configs/ppo_tiny_cpu.py"
COMMON = ["rl.max_steps=4", "rl.save_every=2", "rl.validation=null", "rl.epochs=1"]


def arm_kill(run_name: str, engine: int, iteration: int) -> threading.Thread:
    """Engine `engine` of the run SIGKILLs itself when its generate reaches `iteration`."""
    import ray

    actor = "rollout" if engine == 0 else f"rollout-rank{engine}"

    def arm(role, at=iteration):
        import os as inside

        original = role._sample

        def dying(prompts, *args, **kwargs):
            if prompts.iteration == at:
                inside.kill(inside.getpid(), signal.SIGKILL)
            return original(prompts, *args, **kwargs)

        role._sample = dying

    def find() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                handle = ray.get_actor(actor, namespace=f"ppo-{run_name}")
            except ValueError:
                time.sleep(0.05)
                continue
            ray.get(handle.__ray_call__.remote(arm))
            return

    thread = threading.Thread(target=find, daemon=True)
    thread.start()
    return thread


def one_run(root: Path, name: str, engines: int, extra: list[str], kill_at: int | None, auto_resume: int) -> dict:
    from flows.training import ppo

    overrides = [f"job.output_root={root}", f"job.name={name}", f"grid.cpu_rollout_engines={engines}", *COMMON, *extra]
    if kill_at is not None:
        arm_kill(name, 1, kill_at)
    started = time.monotonic()
    summary = ppo(profile=PROFILE, overrides=overrides, auto_resume_attempts=auto_resume)
    wall = time.monotonic() - started
    rows = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"wall": wall, "rows": {row["iteration"]: row for row in rows}, "resumed": bool(summary.get("resumed_from"))}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--kill-at", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from cli.environment import apply_default_environment
    from processes.ray_session import prepare_ray_auth

    apply_default_environment()
    prepare_ray_auth(joins_cluster=False)  # before the first `import ray`
    from prefect.testing.utilities import prefect_test_harness

    from processes.ray_session import init_ray

    root = Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    results: dict[int, list[dict[str, Any]]] = {engines: [] for engines in args.engines}
    loads: dict[int, list[str]] = {engines: [] for engines in args.engines}
    with prefect_test_harness(server_startup_timeout=120):
        ray_session = init_ray(num_cpus=2)
        try:
            one_run(root, "warm-up", 2, [*args.overrides, "rl.max_steps=1"], None, 0)  # first-run costs, not timed
            for repeat in range(args.repeats):
                for engines in args.engines:
                    loads[engines].append(loadavg())
                    tag = f"{engines}-{repeat}"
                    results[engines].append({
                        "undisturbed": one_run(root, f"undisturbed-{tag}", engines, args.overrides, None, 0),
                        "elastic": one_run(root, f"elastic-{tag}", engines, args.overrides, args.kill_at, 0),
                        "today": one_run(
                            root, f"today-{tag}", engines,
                            [*args.overrides, "rl.rollout.max_engine_replacements=0"], args.kill_at, 1,
                        ),
                    })
                    loads[engines].append(loadavg())
        finally:
            ray_session.close()
    report(results, loads, args.kill_at, args.overrides)


def report(
    results: dict[int, list[dict[str, Any]]], loads: dict[int, list[str]], at: int, overrides: list[str]
) -> None:
    """Medians over the repeats, and every repeat's figure beside them."""
    print(f"\nengine 1 SIGKILLed inside generate of iteration {at}; {PROFILE} {' '.join(COMMON + overrides)}")
    for engines, rounds in results.items():
        def series(value) -> str:
            figures = [value(r) for r in rounds]
            return f"{statistics.median(figures):+.2f} s (" + ", ".join(f"{f:+.2f}" for f in figures) + ")"

        def stage(key: str):
            return lambda r: r["elastic"]["rows"][at][key] - r["undisturbed"]["rows"][at][key]

        print(f"\n{engines} engines, {len(rounds)} repeats; load average (1, 5, 15 min) around each repeat: "
              + "; ".join(loads[engines]))
        print("  undisturbed run wall: " + ", ".join(f"{r['undisturbed']['wall']:.1f}" for r in rounds) + " s")
        elastic_wall = series(lambda r: r["elastic"]["wall"] - r["undisturbed"]["wall"])
        print(f"  elastic, run wall vs undisturbed:        {elastic_wall}")
        print(f"    iteration {at} time/iteration_seconds:   {series(stage('time/iteration_seconds'))}")
        print(f"    iteration {at} time/rollout_seconds:     {series(stage('time/rollout_seconds'))}")
        print(f"    iteration {at} time/weight_sync_seconds: {series(stage('time/weight_sync_seconds'))}")
        replaced = [
            r["elastic"]["rows"].get(at + 1, {}).get("fault/rollout_replace_seconds", float("nan")) for r in rounds
        ]
        print(f"    replacement start-up and load (row {at + 1}): {statistics.median(replaced):.2f} s ("
              + ", ".join(f"{f:.2f}" for f in replaced) + ")")
        print(f"  today (fail, auto-resume), run wall vs undisturbed: "
              f"{series(lambda r: r['today']['wall'] - r['undisturbed']['wall'])}; resumed each time: "
              f"{all(r['today']['resumed'] for r in rounds)}; elastic never resumed: "
              f"{not any(r['elastic']['resumed'] for r in rounds)}")


if __name__ == "__main__":
    main()
