"""Does a long run stay on a bounded footprint? (S-FOOT-1)

Runs the real command line (`python -m flows.ppo`) on a profile, the tiny CPU one by
default, for N iterations, with a Prefect home of its own (so its embedded API starts
on a fresh SQLite database) and its own output folder. Every `--interval` seconds it
samples, from /proc, every process the run started: the driver, the Prefect API, Ray's
GCS, raylet and other daemons, the fork server and each role actor, their resident
memory and CPU seconds; the Prefect database's size (with its write-ahead log); and the
iterations finished so far. At the end it reads each iteration's time from the run's
metrics.jsonl and counts the database's rows by table.

Written to the output folder: `samples.csv` (one line per sample and process),
`soak.md` (growth per 1,000 iterations after the warm-up, fitted by least squares; CPU
per iteration; the iteration time early and late; the load average) and, when
matplotlib is installed, `soak.png`.

With `--database postgres` the run goes to a standing stack instead: `make serve
PPO_PREFECT_DB=postgres` started in the output folder on a free port (the server, its
history compactor and a local PostgreSQL 15 cluster), stopped at the end; their
processes are sampled too, and the database's size is PostgreSQL's own
(`pg_database_size`).

    .venv/bin/python -m bench.soak --iterations 1000
    .venv/bin/python -m bench.soak --iterations 1000 --database postgres
    nice .venv/bin/python -m bench.soak --iterations 300 --interval 5 --out /tmp/soak -- rl.save_every=50
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILE = "configs/ppo_tiny_cpu.py"
RUN_NAME = "soak"
MIB = 1024 * 1024
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Sample:
    elapsed_s: float
    iterations: int
    database_mib: float
    processes: dict[str, tuple[float, float]]  # label -> (RSS MiB, CPU seconds)
    load: float


@dataclass
class Soak:
    out: Path
    samples: list[Sample] = field(default_factory=list)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return None


def process_table() -> dict[int, tuple[int, str, float, float]]:
    """pid -> (parent pid, command line, RSS MiB, CPU seconds) of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat, statm = _read(f"/proc/{entry}/stat"), _read(f"/proc/{entry}/statm")
        if stat is None or statm is None:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        cmdline = (_read(f"/proc/{entry}/cmdline") or "").replace("\0", " ").strip()
        rss = int(statm.split()[1]) * _PAGE / MIB
        table[int(entry)] = (int(fields[1]), cmdline, rss, (int(fields[11]) + int(fields[12])) / _TICKS)
    return table


def label_of(pid: int, root: int, cmdline: str) -> str:
    """What a user would call the process: the Ray actors by their role class."""
    if pid == root:
        return "driver"
    if "history_compactor" in cmdline:
        return "history compactor"
    if cmdline.startswith("postgres") or "/postgresql/" in cmdline:
        return "postgresql"
    if cmdline.startswith("ray::"):
        return cmdline.split()[0].split(".")[0]  # ray::PolicyRole (ray::PolicyRole.train_batch while it runs)
    if "processes.temporary_server" in cmdline or ("prefect" in cmdline and "server" in cmdline):
        return "prefect api"
    for name in ("gcs_server", "raylet", "dashboard_agent", "log_monitor", "runtime_env", "monitor.py"):
        if name in cmdline:
            return f"ray {name}"
    if "processes.fork_server" in cmdline:
        return "fork server"
    if "default_worker.py" in cmdline:
        return "ray worker (starting)"
    return "other: " + (Path(cmdline.split()[0]).name if cmdline else "?")


def descendants(root: int, *others: int) -> dict[str, tuple[float, float]]:
    """label -> (RSS MiB, CPU s) summed over the roots and every process below them; two
    actors of one class get `#2`, `#3` labels in pid order."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, *_rest) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [root, *others]
    while stack:
        pid = stack.pop()
        if pid in table:
            found.append(pid)
            stack.extend(children.get(pid, []))
    result: dict[str, tuple[float, float]] = {}
    for pid in sorted(found):
        _, cmdline, rss, cpu = table[pid]
        label = label_of(pid, root, cmdline)
        if label.startswith("ray::") and label in result:
            number = 2
            while f"{label}#{number}" in result:
                number += 1
            label = f"{label}#{number}"
        old = result.get(label, (0.0, 0.0))
        result[label] = (old[0] + rss, old[1] + cpu)
    return result


def database_mib(home: Path) -> float:
    return sum(p.stat().st_size for p in home.glob("prefect.db*") if p.is_file()) / MIB


@dataclass
class Stack:
    """`make serve PPO_PREFECT_DB=postgres` in `folder`: its environment, the roots of its
    process trees (server, compactor, PostgreSQL) and its database's size."""

    folder: Path
    env: dict[str, str]

    @classmethod
    def start(cls, folder: Path, base: dict[str, str]) -> "Stack":
        from processes.temporary_api import free_loopback_port

        env = {**base, "PPO_PREFECT_STATE_DIR": str(folder), "PPO_PREFECT_DB": "postgres",
               "PPO_PREFECT_PORT": str(free_loopback_port())}
        with open(folder.parent / "serve.log", "w") as log:
            subprocess.run(["bash", "deployments/serve.sh"], cwd=REPO_ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT, check=True)
        sourced = subprocess.run(["sh", "-c", f'. "{folder}/env.sh" && env -0'], env=env, capture_output=True,
                                 check=True).stdout.decode()
        return cls(folder, dict(item.split("=", 1) for item in sourced.split("\0") if "=" in item))

    def roots(self) -> list[int]:
        pids = [self.folder / f"{name}.pid" for name in ("server", "compactor")]
        pids.append(self.folder / "postgres" / "data" / "postmaster.pid")
        return [int(path.read_text().split()[0]) for path in pids if path.exists()]

    def database_mib(self) -> float:
        import asyncio

        import asyncpg

        from deployments.local_postgres import LocalPostgres

        url = LocalPostgres(self.folder / "postgres").url().replace("postgresql+asyncpg", "postgresql")

        async def size() -> int:
            connection = await asyncpg.connect(url)
            try:
                return await connection.fetchval("SELECT pg_database_size('prefect')")
            finally:
                await connection.close()

        return asyncio.run(size()) / MIB

    def stop(self) -> None:
        subprocess.run(["bash", "deployments/stop.sh"], cwd=REPO_ROOT, env=self.env, capture_output=True)


def lines_in(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return handle.read().count(b"\n")
    except OSError:
        return 0


def slope_per_1000(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x (iterations), times 1,000."""
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return 1000 * sum((x - mean_x) * (y - mean_y) for x, y in points) / var


def row_counts(database: Path) -> dict[str, int]:
    if not database.exists():
        return {}
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)
    try:
        tables = [r[0] for r in connection.execute("select name from sqlite_master where type='table'")]
        counts = {t: connection.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables}
    finally:
        connection.close()
    return {t: n for t, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n}


def iteration_seconds(metrics: Path) -> list[tuple[int, float]]:
    import json

    seen: dict[int, float] = {}
    for line in (metrics.read_text().splitlines() if metrics.exists() else []):
        record = json.loads(line)
        if "time/iteration_seconds" in record:
            seen[int(record["iteration"])] = float(record["time/iteration_seconds"])
    return sorted(seen.items())


def run(args: argparse.Namespace) -> Soak:
    out = Path(args.out).resolve()
    home, runs = out / "prefect-home", out / "runs"
    home.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_PROFILES_PATH")}
    env["PREFECT_HOME"] = str(home)
    stack = Stack.start(out / "stack", env) if args.database == "postgres" else None
    if stack is not None:
        env = stack.env
        print(f"soak: make serve PPO_PREFECT_DB=postgres at {env['PREFECT_API_URL']}")
    command = [
        sys.executable, "-m", "flows.ppo", "--config", args.profile, "--",
        f"rl.max_steps={args.iterations}", f"job.output_root={runs}", f"job.name={RUN_NAME}", *args.overrides,
    ]
    soak = Soak(out)
    metrics = runs / RUN_NAME / "metrics.jsonl"
    log = open(out / "run.log", "w")
    started = time.monotonic()
    child = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    print(f"soak: pid {child.pid}, {args.iterations} iterations, samples every {args.interval:g} s into {out}")
    size = stack.database_mib if stack is not None else lambda: database_mib(home)
    try:
        while child.poll() is None:
            sample = Sample(time.monotonic() - started, lines_in(metrics), size(),
                            descendants(child.pid, *(stack.roots() if stack else ())), os.getloadavg()[0])
            soak.samples.append(sample)
            if len(soak.samples) % max(1, int(60 / args.interval)) == 0:
                print(f"soak: {sample.elapsed_s:.0f} s, {sample.iterations} iterations, "
                      f"database {sample.database_mib:.1f} MiB, load {sample.load:.2f}", flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        os.killpg(child.pid, signal.SIGINT)  # the run stops as after a Ctrl-C: committed, resumable
        child.wait()
    finally:
        if stack is not None:
            stack.stop()
    log.close()
    print(f"soak: the run exited with {child.returncode} after {time.monotonic() - started:.0f} s")
    return soak


def write_csv(soak: Soak) -> Path:
    path = soak.out / "samples.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["elapsed_s", "iterations", "database_mib", "load1", "process", "rss_mib", "cpu_s"])
        for s in soak.samples:
            for label, (rss, cpu) in sorted(s.processes.items()):
                writer.writerow([f"{s.elapsed_s:.1f}", s.iterations, f"{s.database_mib:.2f}", f"{s.load:.2f}",
                                 label, f"{rss:.1f}", f"{cpu:.2f}"])
    return path


def summary(soak: Soak, warmup: int, label: str) -> str:
    samples = [s for s in soak.samples if s.iterations > 0]
    if not samples:
        return "no iteration finished\n"
    after = [s for s in samples if s.iterations >= warmup] or samples
    last = samples[-1]
    times = iteration_seconds(soak.out / "runs" / RUN_NAME / "metrics.jsonl")
    lines = [
        f"# Soak: {label}", "",
        f"{last.iterations} iterations in {last.elapsed_s:.0f} s; warm-up: the first {warmup} iterations; "
        f"load average (1 min) {min(s.load for s in samples):.2f}-{max(s.load for s in samples):.2f}, "
        f"mean {statistics.fmean(s.load for s in samples):.2f} on {os.cpu_count()} CPUs.", "",
        "| what | at the warm-up's end | at the end | growth per 1,000 iterations after the warm-up |",
        "| --- | --- | --- | --- |",
    ]
    growth = slope_per_1000([(s.iterations, s.database_mib) for s in after])
    lines.append(f"| Prefect database (MiB) | {after[0].database_mib:.1f} | {last.database_mib:.1f} | "
                 f"{_number(growth)} |")
    labels = sorted({name for s in samples for name in s.processes})
    live = {name: alive(after, name) for name in labels}
    for name in labels:
        points = [(s.iterations, s.processes[name][0]) for s in live[name]]
        if not points:
            continue
        lines.append(f"| {name} RSS (MiB) | {points[0][1]:.1f} | {points[-1][1]:.1f} | "
                     f"{_number(slope_per_1000(points))} |")
    lines += ["", "| process | CPU ms per iteration after the warm-up |", "| --- | --- |"]
    first, total = after[0], 0.0
    for name in labels:
        seen = live[name]
        # To its last live sample: the run's last sample can catch processes already exiting.
        done = seen[-1].iterations - first.iterations if seen else 0
        if done > 0:
            rate = (seen[-1].processes[name][1] - first.processes.get(name, (0.0, 0.0))[1]) / done
            total += rate
            lines.append(f"| {name} | {1000 * rate:.0f} |")
    lines.append(f"| all | {1000 * total:.0f} |")
    if times:
        tenth = max(1, len(times) // 10)
        early = statistics.median(t for _, t in times[warmup:warmup + tenth] or times[:tenth])
        late = statistics.median(t for _, t in times[-tenth:])
        lines += ["", f"Iteration time (median): {early:.3f} s just after the warm-up, {late:.3f} s over the last "
                      f"{tenth} iterations."]
    counts = row_counts(soak.out / "prefect-home" / "prefect.db")
    if counts:
        lines += ["", "Database rows at the end: " + ", ".join(f"{t} {n}" for t, n in list(counts.items())[:10]) + "."]
    return "\n".join(lines) + "\n"


def alive(samples: list[Sample], name: str) -> list[Sample]:
    """The samples in which process `name` was running: an exiting one reads 0 MiB."""
    return [s for s in samples if s.processes.get(name, (0.0, 0.0))[0] > 0]


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def plot(soak: Soak) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    samples = [s for s in soak.samples if s.iterations > 0]
    if not samples:
        return "no plot: no iteration finished"
    figure, (memory, database, times_axis) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    for name in sorted({n for s in samples for n in s.processes}):
        points = [(s.iterations, s.processes[name][0]) for s in samples if name in s.processes]
        if max(y for _, y in points) >= 20:  # Ray's small helpers would only crowd the legend
            memory.plot([x for x, _ in points], [y - points[0][1] for _, y in points], label=name)
    memory.set_ylabel("RSS change since the first sample (MiB)")
    memory.legend(fontsize=7, ncol=2)
    database.plot([s.iterations for s in samples], [s.database_mib for s in samples])
    database.set_ylabel("Prefect database (MiB)")
    times = iteration_seconds(soak.out / "runs" / RUN_NAME / "metrics.jsonl")
    if times:
        times_axis.plot(*zip(*times), linewidth=0.5)
    times_axis.set_ylabel("iteration time (s)")
    times_axis.set_xlabel("iterations finished")
    figure.tight_layout()
    path = soak.out / "soak.png"
    figure.savefig(path, dpi=90)
    return f"plot: {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--warmup", type=int, default=100, help="iterations left out of the growth fits")
    parser.add_argument("--profile", default=PROFILE)
    parser.add_argument("--out", default=f"outputs/_soak/{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--label", default="", help="what this run measures, for the report's title")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite",
                        help="sqlite: the run's own temporary API; postgres: a make serve stack on PostgreSQL 15")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides, after --")
    args = parser.parse_args(argv)
    soak = run(args)
    print(f"samples: {write_csv(soak)}")
    report = summary(soak, args.warmup, args.label or f"{args.profile}, {args.iterations} iterations")
    report += f"\n{plot(soak)}\n"
    (soak.out / "soak.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
