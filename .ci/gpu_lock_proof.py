"""The CPU profile on requirements-gpu.lock's versions (S-DEP-1); `make test-gpu-lock-versions`.

Run with the python of the environment under test (the Makefile's GPU_LOCK_VENV: torch
2.13.0+cpu, everything else constrained to the GPU lock). From the repository root:

1. checks that torch is a CPU build and that every installed package the GPU lock also
   pins has the GPU lock's version (torch itself excepted), and that the NIXL package
   the transport loads (weights/nixl_package.py) is the GPU lock's build;
2. `python -m flows.ppo --config configs/ppo_tiny_cpu.py -- rl.max_steps=2
   job.name=gpu-lock-proof job.output_root=OUT` must end at policy_version 2;
3. the same with rl.max_steps=3 must resume from the boundary of iteration 2 and end
   at policy_version 3;
4. the same two runs (job gpu-lock-proof-postgres) against a standing `prefect server` of
   this environment's Prefect on a throwaway PostgreSQL 15 cluster (deployments/local_postgres.py,
   loopback; S-TEAM-1), each flow run then read back from that server as Completed; the
   cluster's binaries are required (PPO_PG_BIN, default /usr/lib/postgresql/15/bin);
5. then (with --record) writes the record: what ran, when, the resolver's proof of the
   lock (--resolver-record, written by `.ci/lock_gpu.py --check`) and the environment's
   full `name==version` list. tests/pure/test_locks.py fails when requirements-gpu.lock pins
   another version of a package in that list, so a lock that moves needs this rerun.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata as md
import os
import re
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".ci"))
from gpu_lock_constraints import canonical  # noqa: E402

TOOLS = ("pip", "setuptools", "wheel")  # the venv's own packaging tools: not checked, not recorded
KEY = ("prefect", "ray", "transformers", "fastapi", "starlette", "uvicorn", "pydantic", "tokenizers")
JOB = "gpu-lock-proof"
POSTGRES_JOB = "gpu-lock-proof-postgres"


def lock_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==", 1)
            pins[canonical(name)] = version
    return pins


def installed() -> dict[str, tuple[str, str]]:
    out = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            out[canonical(name)] = (name, dist.version)
    return out


def last(text: str, pattern: str) -> str:
    return next((ln.strip() for ln in reversed(text.splitlines()) if re.search(pattern, ln)), "")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_flow(
    steps: int, output_root: Path, prefect_home: Path, job: str = JOB, api_url: str | None = None
) -> tuple[str, float]:
    cmd = [sys.executable, "-m", "flows.ppo", "--config", "configs/ppo_tiny_cpu.py", "--",
           f"rl.max_steps={steps}", f"job.name={job}", f"job.output_root={output_root}"]
    print("gpu_lock_proof: $", " ".join(["python"] + cmd[1:]), flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PREFECT_API_URL")}
    # Its own Prefect home: a database that Prefect 3.9 (the CPU lock) has migrated stops
    # Prefect 3.7's server at start-up: "Can't locate revision identified by '27d8f4e1a6c9'".
    env["PREFECT_HOME"] = str(prefect_home)
    if api_url:  # a standing server: the run starts no temporary API of its own
        env["PREFECT_API_URL"] = api_url
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    text = proc.stdout + proc.stderr
    print(text, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"gpu_lock_proof: FAILED: rl.max_steps={steps} exited {proc.returncode}")
    return text, took


def two_runs(output_root: Path, prefect_home: Path, job: str, api_url: str | None = None) -> dict[str, str]:
    """Two iterations, then a resume to the third: the figures and lines the record quotes."""
    first, t1 = run_flow(2, output_root, prefect_home, job, api_url)
    if f"done: run {job} at policy_version 2" not in first:
        raise SystemExit(f"gpu_lock_proof: FAILED: the first run of {job} did not end at policy_version 2")
    second, t2 = run_flow(3, output_root, prefect_home, job, api_url)
    resumed = re.search(r"^.*resume: from \S*iter_000002.*$", second, re.M)
    if not resumed or f"done: run {job} at policy_version 3" not in second or not re.search(r"iter\s+3/3", second):
        raise SystemExit(f"gpu_lock_proof: FAILED: the second run of {job} did not resume from iteration 2 "
                         "and reach iteration 3")
    return {"t1": f"{t1:.1f}", "t2": f"{t2:.1f}", "resumed": resumed.group(0).strip(),
            "iter2": last(first, r"^iter +2/2"), "done2": last(first, r"^done: run"),
            "iter3": last(second, r"^iter +3/3"), "done3": last(second, r"^done: run")}


def api_json(url: str, body: dict | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@contextmanager
def postgres_server(prefect_home: Path) -> Iterator[tuple[str, float]]:
    """(API URL, start seconds) of this environment's `prefect server`, on loopback, on a
    throwaway PostgreSQL cluster; the server and then the cluster are stopped on exit."""
    sys.path.insert(0, str(ROOT))
    from deployments.local_postgres import throwaway_cluster

    with throwaway_cluster() as database_url, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PREFECT_API_URL")}
        env.update(PREFECT_HOME=str(prefect_home), PREFECT_SERVER_DATABASE_CONNECTION_URL=database_url,
                   PREFECT_SERVER_ANALYTICS_ENABLED="false")
        log = prefect_home / "server.log"
        started = time.monotonic()
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, cwd=ROOT, stdout=log.open("w"),
                                  stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{port}/api"
        try:
            while True:
                try:
                    api_json(f"{api}/health")
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() - started > 300:
                        raise SystemExit(f"gpu_lock_proof: FAILED: the Prefect server on PostgreSQL did not start; "
                                         f"see {log}") from None
                    time.sleep(1)
            yield api, time.monotonic() - started
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", help="write the record here on success (docs/gpu-lock-proof.txt)")
    parser.add_argument("--output-root", default="/tmp/gpu-lock-proof")
    parser.add_argument("--resolver-record", help="comment lines of `.ci/lock_gpu.py --check`, copied into the record")
    args = parser.parse_args()

    pins = lock_pins(ROOT / "requirements-gpu.lock")
    have = installed()
    import torch

    if torch.version.cuda is not None or not torch.__version__.startswith("2.13.0"):
        raise SystemExit(f"gpu_lock_proof: torch {torch.__version__} (CUDA {torch.version.cuda}): "
                         "this check wants the CPU build of torch 2.13.0")
    wrong = [f"{name} {version} (GPU lock: {pins[key]})" for key, (name, version) in sorted(have.items())
             if key in pins and key != "torch" and key not in TOOLS and pins[key] != version]
    missing = [k for k in KEY if k not in have]
    if wrong or missing:
        raise SystemExit(f"gpu_lock_proof: environment differs from requirements-gpu.lock: {wrong}; missing {missing}")
    print("gpu_lock_proof: torch", torch.__version__, "|",
          ", ".join(f"{k} {have[k][1]}" for k in KEY), flush=True)
    sys.path.insert(0, str(ROOT))
    from weights.nixl_package import nixl_module

    nixl = nixl_module().__name__
    locked_nixl = [name.replace("-", "_") for name in pins if name.startswith("nixl-cu")]
    if [nixl] != locked_nixl:
        raise SystemExit(f"gpu_lock_proof: the NIXL transport loads {nixl}, the GPU lock pins {locked_nixl}")
    print(f"gpu_lock_proof: the NIXL transport loads {nixl} {have[canonical(nixl)][1]}", flush=True)

    output_root = Path(args.output_root)
    shutil.rmtree(output_root / JOB, ignore_errors=True)
    prefect_home = output_root / "prefect-home"
    shutil.rmtree(prefect_home, ignore_errors=True)
    prefect_home.mkdir(parents=True)
    load_before = load()
    sqlite = two_runs(output_root, prefect_home, JOB)
    shutil.rmtree(output_root / POSTGRES_JOB, ignore_errors=True)
    postgres_home = output_root / "prefect-home-postgres"
    shutil.rmtree(postgres_home, ignore_errors=True)
    postgres_home.mkdir(parents=True)
    with postgres_server(postgres_home) as (api, server_s):
        version = api_json(f"{api}/admin/version")
        postgres = two_runs(output_root, postgres_home, POSTGRES_JOB, api)
        flow_runs = api_json(f"{api}/flow_runs/filter", {"sort": "START_TIME_ASC"})
    states = [run["state"]["type"] for run in flow_runs if run["parent_task_run_id"] is None]  # not the blocks
    if states != ["COMPLETED", "COMPLETED"]:
        raise SystemExit(f"gpu_lock_proof: FAILED: the server on PostgreSQL holds the flow runs {states}")
    load_after = load()
    print(f"gpu_lock_proof: passed: 2 iterations in {sqlite['t1']} s, resumed to 3 in {sqlite['t2']} s; on "
          f"PostgreSQL (Prefect server {version}, up in {server_s:.1f} s) {postgres['t1']} s and {postgres['t2']} s "
          f"(load average {load_before} -> {load_after})")

    if args.record:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        header = [
            "# The CPU profile ran on requirements-gpu.lock's versions (S-DEP-1). Written by",
            "# `make test-gpu-lock-versions` (.ci/gpu_lock_proof.py) after every run below passed, in an",
            "# environment with torch 2.13.0+cpu and every other package constrained to the GPU lock.",
            "# tests/pure/test_locks.py fails when requirements-gpu.lock pins another version of any",
            "# package listed below (torch excepted): rerun `make test-gpu-lock-versions` and commit this file.",
            f"# when: {stamp}; {os.cpu_count()} cores; load average {load_before} before, {load_after} after",
            f"# NIXL: weights/nixl_package.py loads {nixl} {have[canonical(nixl)][1]}, the GPU lock's build",
            f"# run 1: python -m flows.ppo --config configs/ppo_tiny_cpu.py -- rl.max_steps=2 job.name={JOB}"
            f" job.output_root={output_root} (PREFECT_HOME={prefect_home}): exit 0 in {sqlite['t1']} s",
            f"#   {sqlite['iter2']}",
            f"#   {sqlite['done2']}",
            f"# run 2: the same with rl.max_steps=3: exit 0 in {sqlite['t2']} s",
            f"#   {sqlite['resumed']}",
            f"#   {sqlite['iter3']}",
            f"#   {sqlite['done3']}",
            f"# on PostgreSQL: this environment's `prefect server start` (version {version}) on a throwaway",
            f"#   PostgreSQL 15 cluster on 127.0.0.1 (healthy in {server_s:.1f} s), PREFECT_API_URL naming it:",
            f"# run 3: rl.max_steps=2 job.name={POSTGRES_JOB}: exit 0 in {postgres['t1']} s",
            f"#   {postgres['iter2']}",
            f"#   {postgres['done2']}",
            f"# run 4: the same with rl.max_steps=3: exit 0 in {postgres['t2']} s",
            f"#   {postgres['resumed']}",
            f"#   {postgres['iter3']}",
            f"#   {postgres['done3']}",
            f"#   both flow runs read back from that server: {', '.join(states)}",
            *(Path(args.resolver_record).read_text().splitlines() if args.resolver_record else []),
            "# the environment:",
        ]
        lines = [f"{name}=={version}" for _, (name, version) in sorted(have.items())
                 if _ not in TOOLS]
        Path(args.record).write_text("\n".join(header + lines) + "\n")
        print(f"gpu_lock_proof: wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
