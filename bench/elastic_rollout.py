"""What one lost rollout engine costs a run: elastic rollout against today's
fail-and-auto-resume (S-ELASTIC-1).

For each engine count, three runs of the same config in one Ray and one temporary
Prefect API, each with fresh role actors (no kept processes, as a real run starts):

- undisturbed, elastic rollout on;
- elastic: engine 1 SIGKILLs itself inside `generate` of iteration `--kill-at`; the
  fleet regenerates its shard on a survivor and starts a replacement;
- today: `rl.rollout.max_engine_replacements=0` and `auto_resume_attempts=1`, the
  same kill: the rollout stage fails, every actor is stopped and started again, and
  the run resumes from the last committed boundary.

It prints each run's wall time, the extra seconds against the undisturbed run, the
killed iteration's own `time/iteration_seconds` and `time/rollout_seconds` against
the undisturbed run's, `fault/rollout_replace_seconds`, and /proc/loadavg before and
after, so a figure taken on a shared machine says what it competed with.

    .venv/bin/python -m bench.elastic_rollout                    # 2 and 4 engines, the CPU profile
    .venv/bin/python -m bench.elastic_rollout --engines 2 -- rl.batch_size=32
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from cli.environment import apply_default_environment
    from processes.ray_session import prepare_ray_auth

    apply_default_environment()
    prepare_ray_auth(joins_cluster=False)  # before the first `import ray`
    from prefect.testing.utilities import prefect_test_harness

    from processes.ray_session import init_ray, shutdown_ray

    root = Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    results: dict[int, dict[str, Any]] = {}
    with prefect_test_harness(server_startup_timeout=120):
        init_ray(num_cpus=2)
        try:
            for engines in args.engines:
                before = loadavg()
                base = one_run(root, f"undisturbed-{engines}", engines, args.overrides, None, 0)
                elastic = one_run(root, f"elastic-{engines}", engines, args.overrides, args.kill_at, 0)
                today = one_run(
                    root, f"today-{engines}", engines, [*args.overrides, "rl.rollout.max_engine_replacements=0"],
                    args.kill_at, 1,
                )
                results[engines] = {"undisturbed": base, "elastic": elastic, "today": today,
                                    "load_before": before, "load_after": loadavg()}
        finally:
            shutdown_ray()
    at = args.kill_at
    print(f"\nengine 1 SIGKILLed inside generate of iteration {at}; {PROFILE} {' '.join(COMMON + args.overrides)}")
    for engines, runs in results.items():
        base, elastic, today = runs["undisturbed"], runs["elastic"], runs["today"]
        killed, straight = elastic["rows"][at], base["rows"][at]
        print(f"\n{engines} engines (load average before {runs['load_before']}, after {runs['load_after']})")
        print(f"  undisturbed run           {base['wall']:7.1f} s")
        print(f"  elastic, one engine lost  {elastic['wall']:7.1f} s  (+{elastic['wall'] - base['wall']:.1f} s); "
              f"iteration {at}: {killed['time/iteration_seconds']:.2f} s vs {straight['time/iteration_seconds']:.2f} s "
              f"(+{killed['time/iteration_seconds'] - straight['time/iteration_seconds']:.2f}), rollout stage "
              f"{killed['time/rollout_seconds']:.2f} s vs {straight['time/rollout_seconds']:.2f} s, replacement "
              f"{killed['fault/rollout_replace_seconds']:.2f} s, resumed: {elastic['resumed']}")
        print(f"  today, fail + auto-resume {today['wall']:7.1f} s  (+{today['wall'] - base['wall']:.1f} s), "
              f"resumed: {today['resumed']}")


if __name__ == "__main__":
    main()
