"""Starting and stopping the fork server (processes/fork_server.py) for a local Ray."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from processes.fork_client import ENABLE_ENV  # "0": every worker imports everything itself, as Ray starts it

CLIENT = Path(__file__).resolve().parent / "fork_client.py"


def py_executable() -> str:
    """What Ray runs in place of `python` for each worker (runtime_env `py_executable`).
    `-S`: the client needs nothing beyond the standard library."""
    return f"{sys.executable} -S {CLIENT}"


def write_launcher(directory: str) -> str:
    """An executable that stands in for `python` in the commands a local Ray starts
    (processes/ray_session.py): the worker command becomes a fork, every other command
    plain Python. Ray runs a worker straight from its worker command only when the job
    has no runtime environment; with one (the runtime-env `py_executable` route) each
    worker first goes through Ray's `setup_worker.py`, an interpreter that imports Ray
    (docs/performance-log.md section 4, session 8)."""
    path = os.path.join(directory, "python")
    with open(path, "w") as launcher:
        launcher.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {shlex.quote(str(CLIENT))} \"$@\"\n")
    os.chmod(path, 0o700)
    return path


def fork_workers_enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


@dataclass
class ForkServer:
    process: subprocess.Popen
    directory: str
    socket_path: str
    watch_fd: int  # this process's end of the pipe the server watches: closing it stops the server
    launcher: str  # what the raylet runs for `python` (write_launcher)

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
    launcher = write_launcher(directory)
    watch_read, watch_write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "processes.fork_server", "--socket", socket_path, "--watch-fd", str(watch_read)],
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
    return ForkServer(process, directory, socket_path, watch_write, launcher)
