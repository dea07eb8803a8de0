"""Where the time to the first iteration goes: the CPU profile launched
as a user launches it, each output line timestamped from the command's start.

For each of `--repeats` fresh runs (a new run name, the shared tiny model) and one
resumed run after each, it records when the CLI had parsed the config, when the
Prefect flow run started (the API is up), when Ray was up, when each role actor was
ready (the actors report it), when iteration 1 ended, and when the process exited;
then prints the medians beside the floor: one fresh process importing torch,
transformers, ray and prefect, measured in the same run. The load average is
printed with every figure: these machines are shared.

    .venv/bin/python -m bench.startup                  # 3 fresh + 3 resumed runs of 2 iterations
    .venv/bin/python -m bench.startup --repeats 1 --iterations 3
    .venv/bin/python -m bench.startup --unforked       # also 3 fresh runs with PPO_FORK_WORKERS=0
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROFILE = "configs/ppo_tiny_cpu.py"
REPO_ROOT = Path(__file__).resolve().parent.parent
MOMENTS = (
    ("config parsed", re.compile(r"^ppo: run ")),
    ("flow run started (Prefect API up)", re.compile(r"^prefect: flow run ")),
    ("Ray up", re.compile(r"^ray: ")),
    ("actors ready", re.compile(r"^actors: ")),
    # The first trained iteration: iteration 0 of a fresh run is the before-training evaluation.
    ("first iteration done", re.compile(r"^iter\s+\d+/\d+\s+reward ")),
    ("run done (final export)", re.compile(r"^done: ")),
)
IMPORT_FLOOR = "import torch, transformers, ray, prefect"


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def timed_run(command: list[str], env: dict[str, str]) -> tuple[dict[str, float], dict[str, float], str]:
    """(moment -> seconds, actor -> seconds after the actors' launch, output)."""
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    moments: dict[str, float] = {}
    actors: dict[str, float] = {}
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        now = time.monotonic() - started
        lines.append(line)
        for name, pattern in MOMENTS:
            if name not in moments and pattern.search(line):
                moments[name] = now
        if line.startswith("iter "):
            moments["last iteration done"] = now
        if line.startswith("actors: "):
            actors = {
                label: float(seconds)
                for label, seconds in re.findall(r"([a-z]+(?: rank \d+)?) ([\d.]+)", line.split("(", 1)[1])
            }
    process.wait()
    moments["process exited"] = time.monotonic() - started
    if "last iteration done" in moments:  # the final export, Ray, the actors and the API stopping
        moments["shutdown (exit - last iteration)"] = moments["process exited"] - moments["last iteration done"]
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{''.join(lines[-30:])}")
    return moments, actors, "".join(lines)


def import_floor(env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", IMPORT_FLOOR], env=env, check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--unforked", action="store_true", help="also fresh runs with PPO_FORK_WORKERS=0")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    root = tempfile.mkdtemp(prefix="ppo-startup-")
    fresh, resumed, unforked, actor_runs, floors = [], [], [], [], []
    print(f"bench.startup: {args.repeats} x (fresh + resumed{' + unforked' if args.unforked else ''}), "
          f"load average {load_average()}", flush=True)
    for repeat in range(args.repeats):
        floors.append(import_floor(env))
        name = f"startup-{os.getpid()}-{repeat}"
        base = [
            sys.executable, "-m", "flows.ppo", "--config", PROFILE, "--", f"job.output_root={root}", f"job.name={name}"
        ]
        moments, actors, _ = timed_run(base + [f"rl.max_steps={args.iterations}"], env)
        fresh.append(moments)
        actor_runs.append(actors)
        moments, _, _ = timed_run(base + [f"rl.max_steps={args.iterations + 1}"], env)
        resumed.append(moments)
        line = (f"  repeat {repeat + 1}: import floor {floors[-1]:.1f} s, first iteration at "
                f"{fresh[-1]['first iteration done']:.1f} s (fresh) / {resumed[-1]['first iteration done']:.1f} s "
                "(resumed)")
        if args.unforked:
            moments, _, _ = timed_run(
                base[:-1] + [f"job.name={name}-unforked", f"rl.max_steps={args.iterations}"],
                {**env, "PPO_FORK_WORKERS": "0"},
            )
            unforked.append(moments)
            line += f" / {moments['first iteration done']:.1f} s (unforked)"
        print(f"{line}, load {load_average()}", flush=True)

    def median(runs: list[dict[str, float]], key: str) -> str:
        values = [run[key] for run in runs if key in run]
        return f"{statistics.median(values):6.1f}" if values else "     -"

    names = [m for m, _ in MOMENTS] + ["last iteration done", "process exited", "shutdown (exit - last iteration)"]
    print(f"\nmedians of {args.repeats} (seconds from the command's start), load average now {load_average()}")
    print(f"  {'moment':<36}{'fresh':>8}{'resumed':>9}" + (f"{'unforked':>10}" if unforked else ""))
    for name in names:
        print(f"  {name:<36}{median(fresh, name):>8}{median(resumed, name):>9}"
              + (f"{median(unforked, name):>10}" if unforked else ""))
    floor = statistics.median(floors)
    first = statistics.median(run["first iteration done"] for run in fresh)
    print(f"  floor: one fresh process running `{IMPORT_FLOOR}`: {floor:.1f} s")
    print(f"  first iteration / floor: {first / floor:.2f}x (fresh)")
    print("\neach actor ready, seconds after the actors were launched (median over the fresh runs)")
    for label in sorted(actor_runs[0], key=lambda label: actor_runs[0][label]):
        print(f"  {label:<16}{statistics.median(run[label] for run in actor_runs if label in run):6.1f}")


if __name__ == "__main__":
    main()
