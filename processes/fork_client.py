"""The `python` a local Ray runs for each worker: asks the fork server for a worker that
already holds torch and transformers, then lives and ends with it, passing signals on;
any other command, or no reachable server, runs as plain Python. Standard library only:
this process starts once per actor (docs/architecture.md, "How a run starts").
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "PPO_FORK_SERVER_SOCKET"
# The file name of Ray's worker script, handed down beside the socket by the Ray session
# (compat/ray_compat.py knows it): the one command that is forked. Unset: none is.
WORKER_SCRIPT_ENV = "PPO_FORK_WORKER_SCRIPT"
ENABLE_ENV = "PPO_FORK_WORKERS"  # "0": every worker starts as plain Python (processes/fork_launch.py)


def is_worker_command(argv: list[str]) -> bool:
    """Ray's worker command (its script, after any interpreter flags), not a daemon's
    or the runtime-environment shim's."""
    script = next((arg for arg in argv if not arg.startswith("-")), "")
    return bool(script) and os.path.basename(script) == os.environ.get(WORKER_SCRIPT_ENV)


def main(argv: list[str]) -> None:
    if not is_worker_command(argv):
        # One of Ray's own daemons: a process group of its own, so a signal to the run's
        # group (a Prefect worker's Cancel, Ctrl-C) reaches the run, which stops cleanly
        # through its Ray, and not this daemon; Ray still stops it by its pid. One the
        # run started in a session of its own already leads its group (setpgid would fail).
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
        os.execv(sys.executable, [sys.executable, *argv])
    path = os.environ.get(SOCKET_ENV) if os.environ.get(ENABLE_ENV, "1") != "0" else None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not path:
            raise OSError("no fork server")
        connection.connect(path)
        body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(connection, [struct.pack("!I", len(body))], [0, 1, 2])
        connection.sendall(body)
        reader = connection.makefile("r")
        first = reader.readline().split()
        if len(first) != 2 or first[0] != "pid":
            raise OSError(f"fork server answered {first!r}")
    except OSError:
        connection.close()
        os.execv(sys.executable, [sys.executable, *argv])
    child = int(first[1])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    ending = reader.readline().split()
    if len(ending) == 2 and ending[0] == "signal":
        signum = int(ending[1])
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    sys.exit(int(ending[1]) if len(ending) == 2 and ending[0] == "exit" else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
