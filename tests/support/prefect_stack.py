"""Starting and stopping the local Prefect stack (`deployments/serve.sh`, `stop.sh`) in
tests, and finding every process a stack started, however deep."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from processes.process_tree import with_environment
from tests.conftest import REPO_ROOT


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pids_with_env(entry: str) -> list[int]:
    """Processes whose environment holds `entry`: everything a stack started, however
    deep (worker, flow runs, the Ray processes a flow run started), and nothing anyone
    else started."""
    return sorted(pid for pid, _ in with_environment(entry))


def kill_pids(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while time.time() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.2)


def run_script(name: str, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """deployments/NAME (serve.sh, stop.sh) from the repository root. The stack's record
    goes beside its state (unless the test names a file), never over the one a
    developer's own `make serve` left in the repository."""
    if "PPO_PREFECT_STATE_DIR" in env and "PPO_PREFECT_SERVE_RECORD" not in env:
        env = dict(env, PPO_PREFECT_SERVE_RECORD=str(Path(env["PPO_PREFECT_STATE_DIR"]) / "serve-record.json"))
    return subprocess.run(
        [str(REPO_ROOT / "deployments" / name)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
