"""Does the Prefect UI stay fast at thousands of iterations? (S-OPS-1)

Starts its own `prefect server` on 127.0.0.1 (a fresh database, the project's server
settings from cli/environment.py), then for each N runs N iterations of the real
flow shape in a fresh process: the real iteration program (flows/iteration.py), the
real `FlowRunner` with one Prefect task per stage named `<stage>[iter=N]`, the block
subflows and the run's history artifacts (views/history.py). Only the model work is
stubbed: the roles are the CPU profile's role bodies in process (a tiny batch), each
method computed once at iteration 1 and its result replayed afterwards, so the stage
tasks carry real summaries and the flow's time is Prefect's. Checkpoint commits and
evaluation are off (8 stage task runs per iteration).

Reported per N: the flow's wall time per iteration and per task run; the history's
API time per iteration at the start and the end of the run (flat: S-OPS-1); the task
runs the API holds at the end against the task runs started; the graph API call
(time, size) for the run and for its middle block; and, in headless Chromium, the
run page and the block page: time until the page settled (its network quiet), the
API calls it made and its slowest call.

    .venv/bin/python -m bench.ui_scale                        # N = 100, 1000, 5000
    .venv/bin/python -m bench.ui_scale --iterations 100 1000 --block 50 --json /tmp/ui.json
    .venv/bin/python -m bench.ui_scale --iterations 100 --screenshots docs/images
    .venv/bin/python -m bench.ui_scale --iterations 1000 --database sqlite postgres

`--database postgres` serves from a throwaway PostgreSQL 15 cluster
(deployments/local_postgres.py) instead of SQLite under the server's home; with both, each
database gets its own server, one after the other, and the table a row per database.

Needs Debian's `chromium` for the page loads (`apt-get install -y chromium`);
without it the page columns are empty.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.local_postgres import execute
from deployments.local_postgres import throwaway_cluster
from cli.environment import DEFAULTS

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILE = "configs/ppo_tiny_cpu.py"
TASKS_PER_ITERATION = 8  # every stage but evaluate and commit (both off here)


# --- the flow, in its own process -------------------------------------------------


class ReplayedMethod:
    """Stands where a Ray actor method would: `.remote(...)` and
    `.options(num_returns=n).remote(...)`. The first call runs the role body; every
    later call hands back that first result."""

    def __init__(self, role: Any, name: str, results: dict[str, Any]) -> None:
        self.role, self.name, self.results = role, name, results

    def options(self, **_: Any) -> "ReplayedMethod":
        return self

    def remote(self, *args: Any) -> Any:
        if self.name not in self.results:
            self.results[self.name] = getattr(self.role, self.name)(*args)
        return self.results[self.name]


class ReplayedRole:
    def __init__(self, role: Any) -> None:
        self._role, self._results = role, {}

    def __getattr__(self, name: str) -> ReplayedMethod:
        return ReplayedMethod(self._role, name, self._results)


class ReplayedRoles:
    def __init__(self, roles: Any) -> None:
        self._roles = {name: ReplayedRole(role) for name, role in roles.items()}

    def __getattr__(self, name: str) -> ReplayedRole:
        return self._roles[name]

    def items(self) -> list[tuple[str, Any]]:
        return list(self._roles.items())

    def ranks(self, role: str) -> list[Any]:
        return [self._roles[role]]

    # One rank of each, as flows/in_process_roles.py InProcessRoles answers.
    def policy_ranks(self) -> list[Any]:
        return [self._roles["policy"]]

    def critic_ranks(self) -> list[Any]:
        return [self._roles["critic"]]

    def reference_ranks(self) -> list[Any]:
        return [self._roles["reference"]]

    def engines(self) -> list[Any]:
        return [self._roles["rollout"]]


def run_flow(iterations: int, block: int, model_dir: str, out: str) -> None:
    """One flow run of `iterations` iterations; writes its figures to `out` (JSON)."""
    from prefect import flow

    from configs.loading import load_config
    from views.history import RunHistory
    from flows.in_process import build_roles
    from flows.flow_runner import FlowIterationLoop, FlowRunner
    from views.run_artifacts import current_flow_run_id

    run_name = f"ui-scale-{iterations}"
    config = load_config(PROFILE, [
        f"job.name={run_name}", f"job.output_root={tempfile.mkdtemp(prefix='ui-scale-')}",
        f"model.path={model_dir}", f"rl.max_steps={iterations}", f"job.iterations_per_block={block}",
        "rl.batch_size=4", "rl.minibatch_size=4", "rl.micro_batch_size=4", "rl.epochs=1",
        "rl.save_every=0", "rl.save_final=false", "rl.validation=null", "job.trackers=[]",
    ])
    roles = ReplayedRoles(build_roles(config))
    history_seconds: list[float] = []

    @flow(name="ppo", flow_run_name=run_name, persist_result=False, log_prints=False)
    def ppo_shape() -> str:
        history = RunHistory.start(config.job.name, iterations)

        def record(row: dict[str, Any]) -> None:
            started = time.perf_counter()
            history.add_iteration(row)
            history_seconds.append(time.perf_counter() - started)

        FlowIterationLoop(FlowRunner(), roles, config, None, record).run_iterations(1, iterations, 0)
        return str(current_flow_run_id())

    started = time.perf_counter()
    flow_run_id = ppo_shape()
    seconds = time.perf_counter() - started
    tenth = max(1, len(history_seconds) // 10)
    Path(out).write_text(json.dumps({
        "flow_run_id": flow_run_id,
        "flow_seconds": seconds,
        "history_first_ms": 1000 * statistics.median(history_seconds[:tenth]),
        "history_last_ms": 1000 * statistics.median(history_seconds[-tenth:]),
    }))


# --- the server and what a user's browser asks of it ------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(home: Path, port: int, log: Path, database_url: str | None = None) -> subprocess.Popen:
    env = {
        **os.environ,
        **{k: v for k, v in DEFAULTS.items() if k.startswith("PREFECT_")},  # the project's server settings
        "PREFECT_HOME": str(home),
        # The UI asks the API at this address (its default is port 4200, whatever --port says).
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",
    }
    env.pop("PREFECT_API_URL", None)
    if database_url:
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url
    process = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO_ROOT,
    )
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(1)
    process.terminate()
    raise SystemExit(f"error: the Prefect server did not come up on port {port}; see {log}")


def timed_get(api: str, path: str) -> tuple[float, int, int]:
    """(seconds, bytes, HTTP status) of one GET, the best of three (the server's
    first answer warms its caches)."""
    import httpx

    tries = []
    for _ in range(3):
        started = time.perf_counter()
        response = httpx.get(f"{api}{path}", timeout=120)
        tries.append((time.perf_counter() - started, len(response.content), response.status_code))
    return min(tries)


@dataclass
class PageLoad:
    settled_s: float | None = None
    api_calls: int = 0
    api_bytes: int = 0
    slowest_call_s: float = 0.0
    slowest_call: str = ""
    failed_calls: list[str] = field(default_factory=list)


def load_page(
    url: str, screenshot: Path | None = None, watch_s: float = 20.0, limit_s: float = 180.0,
    requests: list[dict[str, Any]] | None = None,
) -> PageLoad:
    """Open `url` in headless Chromium (DevTools protocol). The page is settled when
    its graph call (`/graph-v2`) and every API call sent before it have answered: the
    run's graph and header are drawn. The page refetches while open, so its API calls
    are counted over `watch_s` (or until settled, if later): how many, their bytes,
    the slowest (request to last byte). `requests`, when given, receives each API call
    the page made (method, URL, body): what bench/team_database.py replays."""
    import base64

    import httpx
    from websockets.sync.client import connect

    from bench.ui_screenshot import CHROMIUM_FLAGS, find_chromium

    result = PageLoad()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ppo-chromium-") as profile:
        browser = subprocess.Popen(
            [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
             "--window-size=1600,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            targets: list[dict[str, Any]] = []
            deadline = time.monotonic() + 60
            while not targets and time.monotonic() < deadline:
                try:
                    targets = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]
                except httpx.HTTPError:
                    time.sleep(0.5)
            with connect(targets[0]["webSocketDebuggerUrl"], max_size=None) as page:
                ids = iter(range(1, 1_000_000))

                def send(method: str, **params: Any) -> int:
                    command = next(ids)
                    page.send(json.dumps({"id": command, "method": method, "params": params}))
                    return command

                for method in ("Page.enable", "Network.enable"):
                    send(method)
                send("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)
                sent: dict[str, tuple[float, str]] = {}  # request id -> (browser timestamp, url)
                open_api: set[str] = set()
                before_graph: set[str] | None = None  # API calls sent before the graph answered
                started = time.monotonic()
                send("Page.navigate", url=url)
                while time.monotonic() - started < limit_s:
                    if result.settled_s is not None and time.monotonic() - started > watch_s:
                        break
                    try:
                        message = json.loads(page.recv(timeout=0.25))
                    except TimeoutError:
                        continue
                    event, params = message.get("method"), message.get("params", {})
                    if event == "Network.requestWillBeSent" and "/api/" in params["request"]["url"]:
                        sent[params["requestId"]] = (params["timestamp"], params["request"]["url"])
                        open_api.add(params["requestId"])
                        if requests is not None:
                            request = params["request"]
                            requests.append({key: request.get(key) for key in ("method", "url", "postData")})
                    elif (
                        event == "Network.responseReceived" and params["requestId"] in sent
                        and params["response"]["status"] >= 400
                    ):  # API answers only: the UI also asks for icons it does not ship (404)
                        result.failed_calls.append(f"{params['response']['status']} {params['response']['url']}")
                    elif event in ("Network.loadingFinished", "Network.loadingFailed") and params["requestId"] in sent:
                        request = params["requestId"]
                        open_api.discard(request)
                        began, request_url = sent[request]
                        path = request_url.split("/api", 1)[1].split("?")[0]
                        result.api_calls += 1
                        if event == "Network.loadingFailed":
                            result.failed_calls.append(f"{path} ({params.get('errorText', '')})")
                        else:
                            result.api_bytes += int(params.get("encodedDataLength", 0))
                            if params["timestamp"] - began > result.slowest_call_s:
                                result.slowest_call_s, result.slowest_call = params["timestamp"] - began, path
                        if before_graph is None and path.endswith("/graph-v2"):
                            before_graph = set(open_api)
                        elif before_graph is not None:
                            before_graph.discard(request)
                        if before_graph is not None and not before_graph and result.settled_s is None:
                            result.settled_s = time.monotonic() - started
                if screenshot is not None:
                    shot = send("Page.captureScreenshot", format="png")
                    while True:
                        message = json.loads(page.recv(timeout=60))
                        if message.get("id") == shot:
                            screenshot.parent.mkdir(parents=True, exist_ok=True)
                            screenshot.write_bytes(base64.b64decode(message["result"]["data"]))
                            break
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    return result


@dataclass
class Figures:
    iterations: int
    block: int
    loadavg_before: str
    database: str = "sqlite"
    server_start_s: float = 0.0
    flow_s_per_iteration: float = 0.0
    flow_ms_per_task_run: float = 0.0
    history_first_ms: float = 0.0
    history_last_ms: float = 0.0
    task_runs_expected: int = 0
    task_runs_recorded: int = 0
    run_graph_s: float = 0.0
    run_graph_kb: float = 0.0
    run_graph_status: int = 0
    block_graph_s: float = 0.0
    block_graph_kb: float = 0.0
    block_graph_status: int = 0
    run_page: PageLoad | None = None
    block_page: PageLoad | None = None
    # --diagnose-graph: (run, block) graph call seconds again after the pages, after
    # ANALYZE, and after PostgreSQL's JIT compilation is switched off
    graph_again_s: tuple[float, float] | None = None
    graph_analyzed_s: tuple[float, float] | None = None
    graph_without_jit_s: tuple[float, float] | None = None
    loadavg_after: str = ""


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(
    iterations: int, block: int, api: str, model_dir: str, screenshots: Path | None,
    database: str = "sqlite", server_start_s: float = 0.0, diagnose_url: str | None = None,
) -> Figures:
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    from flows.recording import count_task_runs, run_flow_runs

    figures = Figures(iterations, block, loadavg(), database, server_start_s)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, "-m", "bench.ui_scale", "--flow", str(iterations), str(block), model_dir, out.name],
            check=True, cwd=REPO_ROOT,
            env={**os.environ, "PREFECT_API_URL": api, "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING"},
        )
        flow = json.loads(Path(out.name).read_text())
    blocks = -(-iterations // block)
    figures.task_runs_expected = iterations * TASKS_PER_ITERATION + blocks  # + one task run per block subflow
    figures.flow_s_per_iteration = flow["flow_seconds"] / iterations
    figures.flow_ms_per_task_run = 1000 * flow["flow_seconds"] / (iterations * TASKS_PER_ITERATION)
    figures.history_first_ms, figures.history_last_ms = flow["history_first_ms"], flow["history_last_ms"]
    run_id = UUID(flow["flow_run_id"])
    with get_client(sync_client=True) as client:
        figures.task_runs_recorded = count_task_runs(client, run_flow_runs(run_id))
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        )
    middle = children[len(children) // 2] if children else None
    figures.run_graph_s, size, figures.run_graph_status = timed_get(api, f"/flow_runs/{run_id}/graph-v2")
    figures.run_graph_kb = size / 1000
    if middle is not None:
        figures.block_graph_s, size, figures.block_graph_status = timed_get(api, f"/flow_runs/{middle.id}/graph-v2")
        figures.block_graph_kb = size / 1000
    ui = api[: -len("/api")]
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        shot = (lambda name: screenshots / f"ui-scale-{iterations}-{name}.png") if screenshots else (lambda name: None)
        figures.run_page = load_page(f"{ui}/runs/flow-run/{run_id}", shot("run"))
        if middle is not None:
            figures.block_page = load_page(f"{ui}/runs/flow-run/{middle.id}", shot("block"))
    if diagnose_url and middle is not None:
        def graphs() -> tuple[float, float]:
            return (timed_get(api, f"/flow_runs/{run_id}/graph-v2")[0],
                    timed_get(api, f"/flow_runs/{middle.id}/graph-v2")[0])

        figures.graph_again_s = graphs()
        execute(diagnose_url, "ANALYZE")
        figures.graph_analyzed_s = graphs()
        execute(diagnose_url, "ALTER SYSTEM SET jit = off", "SELECT pg_reload_conf()")
        time.sleep(2)  # the server's pooled connections read the reloaded setting at their next query
        figures.graph_without_jit_s = graphs()
    figures.loadavg_after = loadavg()
    return figures


def table(rows: list[Figures]) -> str:
    def page(load: PageLoad | None) -> str:
        if load is None:
            return "-"
        settled = "graph never loaded" if load.settled_s is None else f"{load.settled_s:.1f} s"
        failed = f", {len(load.failed_calls)} failed" if load.failed_calls else ""
        return (
            f"{settled}; {load.api_calls} API calls in its first 20 s{failed}, "
            f"slowest {load.slowest_call_s:.2f} s ({load.slowest_call})"
        )

    lines = [
        "| database (server start) | iterations (block) | flow per iteration / per task run | "
        "history per iteration, first / last tenth | "
        "task runs recorded / started | run graph | block graph | run page | block page | load avg before, after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.database} ({r.server_start_s:.0f} s) | {r.iterations:,} ({r.block}) | "
            f"{r.flow_s_per_iteration:.3f} s / {r.flow_ms_per_task_run:.1f} ms | "
            f"{r.history_first_ms:.0f} / {r.history_last_ms:.0f} ms | "
            f"{r.task_runs_recorded:,} / {r.task_runs_expected:,} | "
            f"{r.run_graph_s * 1000:.0f} ms, {r.run_graph_kb:.0f} KB (HTTP {r.run_graph_status}) | "
            f"{r.block_graph_s * 1000:.0f} ms, {r.block_graph_kb:.0f} KB (HTTP {r.block_graph_status}) | "
            f"{page(r.run_page)} | {page(r.block_page)} | {r.loadavg_before} → {r.loadavg_after} |"
        )
    def ms(pair: tuple[float, float] | None) -> str:
        return "-" if pair is None else f"{pair[0] * 1000:.0f} / {pair[1] * 1000:.0f} ms"

    for r in rows:
        if r.graph_again_s is not None:
            lines.append(
                f"\n{r.database}, {r.iterations:,} iterations, graph calls (run / block) again after the pages "
                f"{ms(r.graph_again_s)}; after ANALYZE {ms(r.graph_analyzed_s)}; with jit = off "
                f"{ms(r.graph_without_jit_s)}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--flow"]:  # the child process: one flow run
        run_flow(int(argv[1]), int(argv[2]), argv[3], argv[4])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.ui_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--block", type=int, default=None, help="job.iterations_per_block (default: the schema's)")
    parser.add_argument("--screenshots", type=Path, default=None, help="write each run's and block's page here")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep-server", action="store_true", help="leave the server running (prints its address)")
    parser.add_argument("--database", nargs="+", choices=["sqlite", "postgres"], default=["sqlite"],
                        help="the server's database: SQLite in its home, or a throwaway PostgreSQL 15 cluster")
    parser.add_argument("--diagnose-graph", action="store_true",
                        help="on PostgreSQL, time the graph calls again, after ANALYZE and with jit = off")
    args = parser.parse_args(argv)
    if args.block is None:
        from configs.schema import JobConfig

        args.block = JobConfig().iterations_per_block

    if args.keep_server and args.database != ["sqlite"]:
        parser.error("--keep-server is for one SQLite server (a throwaway PostgreSQL is removed at the end)")

    port = free_port()  # one address for every server, one after another: Prefect reads it once
    api = f"http://127.0.0.1:{port}/api"
    os.environ["PREFECT_API_URL"] = api  # before this process imports Prefect
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    rows = []
    for database in args.database:
        with ExitStack() as cleanup:
            database_url = cleanup.enter_context(throwaway_cluster()) if database == "postgres" else None
            work = Path(tempfile.mkdtemp(prefix=f"ppo-ui-scale-{database}-"))
            started = time.monotonic()
            server = start_server(work / "home", port, work / "server.log", database_url)
            server_start_s = time.monotonic() - started
            print(f"server on {database}: {api} up in {server_start_s:.0f} s (log {work / 'server.log'})", flush=True)
            try:
                for iterations in args.iterations:
                    rows.append(measure(
                        iterations, args.block, api, str(work / "model"), args.screenshots, database, server_start_s,
                        database_url if args.diagnose_graph else None,
                    ))
                    print(table(rows[-1:]), flush=True)
            finally:
                if args.keep_server:
                    print(f"server left running: {api} (pid {server.pid})")
                else:
                    server.terminate()
                    server.wait(timeout=60)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
