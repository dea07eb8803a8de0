"""What Prefect itself costs per task run and per log line, in CPU (S-FOOT-1).

Every PPO stage is its own Prefect task run and logs one line of figures, so an
iteration pays Prefect's per-task-run and per-line cost whatever the project's own code
does. This measures both against the same temporary API a run starts (same settings,
same recorder batching), in CPU milliseconds of the flow process and of the API:

1. the API's idle rate, to subtract from what follows;
2. `--tasks` empty tasks with the stage tasks' options (no cache, no result);
3. as many tasks that each log one stage-like line;
4. that many lines logged from one task (the line without the task);
5. that many four-row tables (an iteration's samples artifact, S-OPS-3) and
   progress updates (the run's progress artifact).

From these it prints the floor an iteration of `--per-iteration` task runs and lines,
one table and its share of progress updates cannot go under, to hold against the
soak's orchestration CPU (bench/soak.py).

    .venv/bin/python -m bench.task_cost                  # 300 of each, about a minute
    .venv/bin/python -m bench.task_cost --tasks 600 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from bench.cpu_accounting import read_stat

SAMPLES = [
    {"prompt": "copy: 7", "completion": "7", "reward": 1.0, "advantage": 0.42, "version": 3} for _ in range(4)
]
LINE = "rollout: reward/mean=0.4375 reward/std=0.4961 response/length_mean=3.0000 time/generate=0.0210"


@dataclass
class Cost:
    flow_ms: float  # this (the flow's) process, every thread
    api_ms: float  # the temporary API, less its idle rate

    def per(self, count: int) -> Cost:
        return Cost(self.flow_ms / count, self.api_ms / count)


def _cpu_s(pid: int) -> float:
    stat = read_stat(pid)
    if stat is None:
        raise RuntimeError(f"the temporary API (pid {pid}) is gone")
    return stat[1]


class Meter:
    """CPU of this process and the API over a phase, the phase's trailing wait for the
    API's batched recorder (flushed every second) included."""

    def __init__(self, api_pid: int, settle_s: float):
        self.api_pid = api_pid
        self.settle_s = settle_s
        self.idle_api_per_s = 0.0

    def calibrate(self, seconds: float) -> None:
        api0, t0 = _cpu_s(self.api_pid), time.monotonic()
        time.sleep(seconds)
        self.idle_api_per_s = (_cpu_s(self.api_pid) - api0) / (time.monotonic() - t0)

    def measure(self, phase) -> Cost:
        flow0, api0, t0 = time.process_time(), _cpu_s(self.api_pid), time.monotonic()
        phase()
        time.sleep(self.settle_s)
        elapsed = time.monotonic() - t0
        api = _cpu_s(self.api_pid) - api0 - self.idle_api_per_s * elapsed
        return Cost(1000 * (time.process_time() - flow0), 1000 * max(api, 0.0))


def measure_costs(meter: Meter, tasks: int, repeats: int) -> dict[str, list[Cost]]:
    """Each phase's cost per task run (or line), `repeats` times, in one flow run."""
    from prefect import flow, get_run_logger, task
    from prefect.artifacts import TableArtifact, create_progress_artifact, update_progress_artifact

    from tasks.prefect_tasks import STAGE_TASK

    @task(name="empty", task_run_name="empty[iter={iteration}]", **STAGE_TASK)
    def empty(iteration: int) -> int:
        return iteration

    @task(name="logged", task_run_name="logged[iter={iteration}]", **STAGE_TASK)
    def logged(iteration: int) -> int:
        get_run_logger().info(LINE)
        return iteration

    @task(name="lines", task_run_name="lines", **STAGE_TASK)
    def lines(count: int) -> int:
        logger = get_run_logger()
        for _ in range(count):
            logger.info(LINE)
        return count

    def tables(count: int) -> None:
        for i in range(count):
            TableArtifact(table=SAMPLES, key="task-cost-samples", description=f"samples of iteration {i}").create()

    def progress(count: int) -> None:
        progress_id = create_progress_artifact(0.0, key="task-cost-progress")
        for i in range(count):
            update_progress_artifact(progress_id, 100 * (i + 1) / count, description=f"iteration {i + 1}")

    results: dict[str, list[Cost]] = {
        "task run": [], "task run with a line": [], "log line": [], "samples table": [], "progress update": [],
    }

    @flow(name="task-cost", persist_result=False, log_prints=False)
    def phases() -> None:
        for i in range(20):  # imports, connections, the recorder's first flush
            logged(i)
        time.sleep(meter.settle_s)
        meter.calibrate(meter.settle_s)
        for repeat in range(repeats):
            results["task run"].append(meter.measure(lambda: [empty(i) for i in range(tasks)]).per(tasks))
            results["task run with a line"].append(
                meter.measure(lambda: [logged(i) for i in range(tasks)]).per(tasks)
            )
            results["log line"].append(meter.measure(lambda: lines(tasks)).per(tasks))
            results["samples table"].append(meter.measure(lambda: tables(tasks)).per(tasks))
            results["progress update"].append(meter.measure(lambda: progress(tasks)).per(tasks))
            print(f"task_cost: repeat {repeat + 1}/{repeats} done", flush=True)

    phases()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="task runs (and lines) per phase")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds for the API's recorder after a phase")
    parser.add_argument("--per-iteration", type=float, nargs=2, default=(8.2, 8.3), metavar=("TASKS", "LINES"),
                        help="task runs and log lines of one tiny iteration (the soak's database: 8.2 and 8.3)")
    parser.add_argument("--iteration-seconds", type=float, default=0.3,
                        help="one iteration's wall time: the progress goes out at most every "
                             "views.history.PROGRESS_EVERY_S (the tiny profile: 0.3 s)")
    args = parser.parse_args(argv)

    from cli.environment import apply_default_environment

    home = tempfile.mkdtemp(prefix="task-cost-")
    os.environ["PREFECT_HOME"] = home  # a fresh database, as a run's first start
    apply_default_environment()
    from cli.command import drain_prefect, temporary_api_settings
    from processes.temporary_api import start_temporary_api
    from views.history import PROGRESS_EVERY_S

    api = start_temporary_api()
    if api is None:
        print("task_cost: a standing Prefect API is configured (PREFECT_API_URL); unset it to measure the "
              "temporary API a run starts", file=sys.stderr)
        return 2
    try:
        if not api.wait_until_up(120):
            print("task_cost: the temporary API did not answer within 120 s", file=sys.stderr)
            return 1
        with temporary_api_settings(api):
            results = measure_costs(Meter(api.process.pid, args.settle), args.tasks, args.repeats)
            drain_prefect()
    finally:
        api.stop()
    load = os.getloadavg()
    print(f"\nPrefect's CPU per task run, log line and artifact write, median of {args.repeats} x {args.tasks} "
          f"(load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}):")
    print(f"| {'':24} | flow process ms | API ms | both ms |")
    print(f"| {'-' * 24} | ---: | ---: | ---: |")
    medians = {}
    for name, costs in results.items():
        flow_ms = statistics.median(c.flow_ms for c in costs)
        api_ms = statistics.median(c.api_ms for c in costs)
        medians[name] = Cost(flow_ms, api_ms)
        print(f"| {name:24} | {flow_ms:.2f} | {api_ms:.2f} | {flow_ms + api_ms:.2f} |")
    per_tasks, per_lines = args.per_iteration
    progress = min(1.0, args.iteration_seconds / PROGRESS_EVERY_S)
    counts = {"task run": per_tasks, "log line": per_lines, "samples table": 1, "progress update": progress}
    flow_ms = sum(n * medians[name].flow_ms for name, n in counts.items())
    api_ms = sum(n * medians[name].api_ms for name, n in counts.items())
    print(f"\nan iteration of {per_tasks:g} task runs, {per_lines:g} lines, a samples table and {progress:.2g} "
          "progress updates: "
          f"at least {flow_ms:.0f} ms in the flow process and {api_ms:.0f} ms in the API, "
          f"{flow_ms + api_ms:.0f} ms in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
