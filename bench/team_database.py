"""Is PostgreSQL a better home for a team's Prefect server than SQLite?

For each database, one after the other: `deployments/serve.sh` brings up the stack
(`PPO_PREFECT_DB=sqlite` or `postgres`, a fresh state folder under /tmp, 127.0.0.1),
three runs of `ppo/tiny-cpu` are started at once, and a browser tab per run is
imitated while they run: the API calls the Prefect UI's run page makes when it opens
and then every few seconds (recorded from the Prefect 3.9 UI with bench/ui_scale.py's
`load_page(..., requests=...)`), each one timed. Then `deployments/stop.sh` stops the
stack by its pid files and whatever the runs left (Ray) is stopped by pid.

Reported per database: serve.sh's time and the server's own start (process to healthy
API), the runs' states and wall times, the UI calls (count, median, 95th percentile,
slowest), database errors and stalls: calls answered 5xx or not at all, calls slower
than --stall-seconds, and the logs' "database is locked" lines and client retries.

    .venv/bin/python -m bench.team_database                      # both, 3 runs x 2 iterations
    .venv/bin/python -m bench.team_database --database postgres --iterations 3 --json /tmp/team.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from processes.process_tree import terminate, with_environment

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILE = "configs/ppo_tiny_cpu.py"
SMALL_BATCH = ["rl.batch_size=16", "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", "rl.validation=null"]
MARKER = "PPO_BENCH_STACK"  # in the environment of everything the stack starts, however deep
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# What the log lines of a database in trouble say: SQLite's lock (Prefect answers it 503),
# the client's retry of a 5xx, and a server-side traceback.
LOG_PATTERNS = {
    "database is locked": re.compile(r"database is locked"),
    "client retries (5xx)": re.compile(r"retryable status code 5\d\d"),
    "tracebacks": re.compile(r"^Traceback \(most recent call last\)", re.M),
}


# --- what a run page of the UI asks, when it opens and while it stays open -----------


def page_open_calls(run_id: str, flow_id: str) -> list[tuple[str, str, dict | None]]:
    run = {"id": {"any_": [run_id]}}
    return [
        ("GET", "/admin/settings", None),
        ("GET", f"/flow_runs/{run_id}", None),
        ("POST", "/task_runs/count", {"flow_runs": run, "task_runs": {"subflow_runs": {"exists_": False}}}),
        ("POST", "/flow_runs/filter", {"flow_runs": {
            "state": {"type": {"any_": ["RUNNING", "SCHEDULED", "PENDING", "PAUSED"]}},
            "parent_flow_run_id": {"any_": [run_id]}}}),
        ("GET", f"/flows/{flow_id}", None),
        *page_poll_calls(run_id),
    ]


def page_poll_calls(run_id: str) -> list[tuple[str, str, dict | None]]:
    """What the page refetches about every 5 s; a running run's graph with it."""
    return [
        ("GET", f"/flow_runs/{run_id}", None),
        ("POST", "/task_runs/count", {"flow_runs": {"id": {"any_": [run_id]}}}),
        ("POST", "/logs/filter", {"logs": {"level": {"ge_": 0}, "flow_run_id": {"any_": [run_id]}},
                                  "sort": "TIMESTAMP_ASC", "offset": 0, "limit": 200}),
        ("GET", f"/flow_runs/{run_id}/graph-v2", None),
    ]


@dataclass
class Call:
    path: str
    seconds: float
    status: int  # 0: no answer (connection error or client timeout)


class RunPageTab(threading.Thread):
    """One open run page: its opening calls, then its polling until the run ends."""

    def __init__(self, api: str, run_id: str, flow_id: str, every_s: float, timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.api, self.run_id, self.flow_id, self.every_s, self.timeout_s = api, run_id, flow_id, every_s, timeout_s
        self.calls: list[Call] = []
        self.state = ""
        self.stop = threading.Event()

    def _call(self, client: Any, method: str, path: str, body: dict | None) -> Any:
        import httpx

        started = time.perf_counter()
        try:
            response = client.request(method, f"{self.api}{path}", json=body, timeout=self.timeout_s)
            status = response.status_code
        except httpx.HTTPError:
            response, status = None, 0
        self.calls.append(Call(re.sub(r"[0-9a-f-]{36}", "{id}", path), time.perf_counter() - started, status))
        return response

    def run(self) -> None:
        import httpx

        with httpx.Client() as client:
            calls = page_open_calls(self.run_id, self.flow_id)
            while not self.stop.is_set():
                for method, path, body in calls:
                    response = self._call(client, method, path, body)
                    if path == f"/flow_runs/{self.run_id}" and response is not None and response.status_code == 200:
                        self.state = (response.json().get("state") or {}).get("type", "")
                if self.state in TERMINAL:
                    return
                calls = page_poll_calls(self.run_id)
                self.stop.wait(self.every_s)


# --- the stack -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass
class Serve:
    total_s: float = 0.0
    postgres_s: float | None = None  # to "started PostgreSQL" (initdb and start)
    server_s: float = 0.0  # the server process started -> healthy API
    lines: list[str] = field(default_factory=list)


def serve(env: dict[str, str]) -> Serve:
    """Runs serve.sh, timing its steps by the lines it prints."""
    figures, started, spawned = Serve(), time.monotonic(), None
    process = subprocess.Popen([str(REPO_ROOT / "deployments" / "serve.sh")], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        now = time.monotonic() - started
        figures.lines.append(line.rstrip())
        if line.startswith("serve: started PostgreSQL"):
            figures.postgres_s = now
        elif line.startswith("serve: starting server"):
            spawned = now
        elif line.startswith("serve: server healthy") and spawned is not None:
            figures.server_s = now - spawned
    if process.wait() != 0:
        raise RuntimeError("serve.sh failed:\n" + "\n".join(figures.lines[-30:]))
    figures.total_s = time.monotonic() - started
    return figures


# --- one database --------------------------------------------------------------------


@dataclass
class Figures:
    database: str
    runs: int
    iterations: int
    loadavg_before: str
    serve_s: float = 0.0
    postgres_s: float | None = None
    server_start_s: float = 0.0
    run_states: list[str] = field(default_factory=list)
    run_wall_s: list[float] = field(default_factory=list)
    ui_calls: int = 0
    ui_median_ms: float = 0.0
    ui_p95_ms: float = 0.0
    ui_slowest_ms: float = 0.0
    ui_slowest_call: str = ""
    ui_5xx_or_no_answer: int = 0
    ui_stalls: int = 0
    log_counts: dict[str, int] = field(default_factory=dict)
    loadavg_after: str = ""
    listening_beyond_loopback: list[str] = field(default_factory=list)


def listening_beyond_loopback(pids: set[int]) -> list[str]:
    """The stack's listening TCP sockets on an address other than loopback (`ss`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        local = line.split()[3]
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if owners & pids and not local.startswith(("127.", "[::1]", "localhost")):
            names = ",".join(re.findall(r'"([^"]+)"', line))
            found.append(f"{local} {names}")
    return found


def bench_database(
    database: str, runs: int, iterations: int, model_dir: str, port: int, every_s: float, stall_s: float,
    timeout_s: float,
) -> Figures:
    from prefect.client.orchestration import get_client

    state_dir = Path(tempfile.mkdtemp(prefix=f"ppo-team-bench-{database}-", dir="/tmp"))
    state_dir.chmod(0o755)  # the cluster runs as the `postgres` user, which must reach its folder
    marker = uuid.uuid4().hex
    api = f"http://127.0.0.1:{port}/api"
    unset = ("PREFECT_API_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(PPO_PREFECT_STATE_DIR=str(state_dir), PPO_PREFECT_PORT=str(port), PPO_PYTHON=sys.executable,
               PPO_PREFECT_DB=database, **{MARKER: marker})
    figures = Figures(database, runs, iterations, loadavg())
    tabs: list[RunPageTab] = []
    try:
        served = serve(env)
        figures.serve_s, figures.postgres_s, figures.server_start_s = served.total_s, served.postgres_s, served.server_s
        print(f"{database}: serve.sh {served.total_s:.1f} s, server start {served.server_s:.1f} s", flush=True)
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("ppo/tiny-cpu")
            output_root = state_dir / "outputs"
            flow_runs = [
                client.create_flow_run_from_deployment(deployment.id, parameters={
                    "overrides": [f"model.path={model_dir}", f"job.output_root={output_root}",
                                  f"rl.max_steps={iterations}", *SMALL_BATCH],
                    "critic_warmup_iterations": 0, "run_name": f"team-bench-{index}",
                })
                for index in range(runs)
            ]
        tabs = [RunPageTab(api, str(run.id), str(run.flow_id), every_s, stall_s * 30) for run in flow_runs]
        for tab in tabs:
            tab.start()
        deadline = time.monotonic() + timeout_s
        listening: set[str] = set()
        while any(tab.is_alive() for tab in tabs) and time.monotonic() < deadline:
            listening.update(listening_beyond_loopback({pid for pid, _ in with_environment(f"{MARKER}={marker}")}))
            time.sleep(every_s)
        figures.listening_beyond_loopback = sorted(listening)
        for tab in tabs:
            tab.stop.set()
            tab.join(timeout=stall_s * 30 + 10)
        with get_client(sync_client=True) as client:
            for run in flow_runs:
                read = client.read_flow_run(run.id)
                figures.run_states.append(read.state.type.value if read.state else "?")
                figures.run_wall_s.append(
                    (read.end_time - read.start_time).total_seconds() if read.end_time and read.start_time else -1.0
                )
    finally:
        for tab in tabs:
            tab.stop.set()
        stop = subprocess.run([str(REPO_ROOT / "deployments" / "stop.sh")], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        terminate(with_environment(f"{MARKER}={marker}"), wait_s=10)  # what the runs left (Ray), by pid
        print(f"{database}: " + " | ".join(stop.stdout.split("\n")).strip(" |"), flush=True)
    calls = [call for tab in tabs for call in tab.calls]
    if calls:
        times = sorted(call.seconds for call in calls)
        slowest = max(calls, key=lambda call: call.seconds)
        figures.ui_calls = len(calls)
        figures.ui_median_ms = 1000 * statistics.median(times)
        figures.ui_p95_ms = 1000 * times[min(len(times) - 1, int(0.95 * len(times)))]
        figures.ui_slowest_ms, figures.ui_slowest_call = 1000 * slowest.seconds, slowest.path
        figures.ui_5xx_or_no_answer = sum(1 for call in calls if call.status == 0 or call.status >= 500)
        figures.ui_stalls = sum(1 for call in calls if call.seconds > stall_s)
    logs = "\n".join(path.read_text(errors="replace") for path in state_dir.glob("*.log"))
    figures.log_counts = {name: len(pattern.findall(logs)) for name, pattern in LOG_PATTERNS.items()}
    figures.loadavg_after = loadavg()
    shutil.rmtree(state_dir, ignore_errors=True)
    return figures


def table(rows: list[Figures], stall_s: float) -> str:
    lines = [
        "| database | serve.sh (server start) | runs: state, wall time | UI calls: count, median / p95 / slowest | "
        f"5xx or no answer | calls over {stall_s:g} s | log: database is locked / client 5xx retries / tracebacks | "
        "load avg before → after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        states = ", ".join(sorted(set(r.run_states))) or "-"
        walls = ", ".join(f"{s:.0f}" for s in r.run_wall_s)
        postgres = f"; PostgreSQL up at {r.postgres_s:.1f} s" if r.postgres_s is not None else ""
        counts = " / ".join(str(r.log_counts.get(name, 0)) for name in LOG_PATTERNS)
        lines.append(
            f"| {r.database} | {r.serve_s:.1f} s ({r.server_start_s:.1f} s{postgres}) | "
            f"{r.runs} x {r.iterations} iterations {states}; {walls} s | "
            f"{r.ui_calls}, {r.ui_median_ms:.0f} / {r.ui_p95_ms:.0f} / {r.ui_slowest_ms:.0f} ms "
            f"({r.ui_slowest_call}) | {r.ui_5xx_or_no_answer} | {r.ui_stalls} | {counts} | "
            f"{r.loadavg_before} → {r.loadavg_after} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.team_database", description=__doc__.splitlines()[0])
    parser.add_argument("--database", nargs="+", choices=["sqlite", "postgres"], default=["sqlite", "postgres"])
    parser.add_argument("--runs", type=int, default=3, help="deployment runs started at once")
    parser.add_argument("--iterations", type=int, default=2, help="rl.max_steps of each run")
    parser.add_argument("--poll-seconds", type=float, default=5.0, help="how often each open run page refetches")
    parser.add_argument("--stall-seconds", type=float, default=2.0, help="a UI call slower than this is a stall")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds to wait for the runs to end")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    port = free_port()  # one address for both stacks, one after the other: Prefect reads it once
    os.environ["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"  # before Prefect is imported
    from configs.loading import load_profile
    from models.model_io import ensure_model

    model = load_profile(str(REPO_ROOT / PROFILE)).model
    model_folder = Path(tempfile.mkdtemp(prefix="ppo-team-bench-model-"))
    model_dir = ensure_model(model.model_copy(update={"path": str(model_folder / "tiny")}))  # once, for every run
    rows = []
    try:
        for database in args.database:
            rows.append(bench_database(database, args.runs, args.iterations, model_dir, port, args.poll_seconds,
                                       args.stall_seconds, args.timeout))
            print(table(rows[-1:], args.stall_seconds), flush=True)
    finally:
        shutil.rmtree(model_folder, ignore_errors=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores\n")
    print(table(rows, args.stall_seconds))
    for r in rows:  # Ray's own ports: a run's local Ray binds every interface (DESIGN.md)
        listening = ", ".join(r.listening_beyond_loopback) or "none"
        print(f"{r.database}: the stack's TCP listeners beyond loopback: {listening}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
