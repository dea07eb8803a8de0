"""The command Ray runs for each worker of a local run (its `py_executable`): asks the
fork server (workers/fork_server.py) for a worker already holding torch and
transformers, then lives until that worker ends and ends the same way, passing on the
signals it gets. Without a reachable server it becomes an ordinary Python worker.

Imports only the standard library: this process starts once per actor.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "PPO_FORK_SERVER_SOCKET"


def main(argv: list[str]) -> None:
    path = os.environ.get(SOCKET_ENV)
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
