"""Starting and stopping the fork server (workers/fork_server.py) for a local Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLIENT = Path(__file__).resolve().parent / "fork_client.py"
ENABLE_ENV = "PPO_FORK_WORKERS"  # "0": every worker imports everything itself, as Ray starts it


def py_executable() -> str:
    """What Ray runs in place of `python` for each worker (runtime_env `py_executable`).
    `-S`: the client needs nothing beyond the standard library."""
    return f"{sys.executable} -S {CLIENT}"


def fork_workers_enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


@dataclass
class ForkServer:
    process: subprocess.Popen
    directory: str
    socket_path: str
    watch_fd: int  # this process's end of the pipe the server watches: closing it stops the server

    def stop(self, timeout_s: float = 10.0) -> None:
        try:
            os.close(self.watch_fd)
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_fork_server(env: dict[str, str]) -> ForkServer:
    """Start the server without waiting for its preload: workers that ask before it is
    done wait in its socket's backlog. Its socket lives in a fresh directory only this
    user can enter; the server stops when this process closes its end of the watch pipe
    or exits, and kills the workers it forked that are still alive then.

    Its own session: a Ctrl-C on the terminal reaches the driver, which stops Ray and
    the server in order, not the workers directly."""
    directory = tempfile.mkdtemp(prefix="ppo-fork-")  # mode 0700
    socket_path = os.path.join(directory, "server.sock")
    watch_read, watch_write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "workers.fork_server", "--socket", socket_path, "--watch-fd", str(watch_read)],
            env=env,
            pass_fds=[watch_read],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        os.close(watch_write)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        os.close(watch_read)
    return ForkServer(process, directory, socket_path, watch_write)
