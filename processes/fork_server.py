"""One process that imports torch, transformers and the role bodies once and forks every
worker of a local Ray run from itself, so a role process only builds its role
(docs/architecture.md, "How a run starts"). It imports no Ray, talks over a Unix socket
only this user can open, and forks only while it has a single thread.
"""

from __future__ import annotations

import argparse
import array
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

from processes.parent_death import parent_death_signal_setter

# Modules every role process imports, or imports on its first model load or call;
# a module that is missing is skipped, not fatal. Not Ray: a worker forked from a
# process that had imported Ray fails its start (its core worker finds no job id).
PRELOAD = (
    "torch",
    "safetensors.torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.generation.utils",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "transformers.processing_utils",
    "transformers.tokenization_python",
    "roles.bodies",  # every role body (the one list of them)
    "roles.rollout.hf_engine",
    # Imported when a role first shards, saves or loads (trainer/sharding.py,
    # trainer/update_runtime.py), not with the role bodies.
    "torch.distributed.fsdp",
    "checkpoint.sharded_role",
    # What `import ray` brings from other packages, in every worker.
    "google.protobuf",
    "requests",
    "urllib3",
    "attr",
    "jsonschema",
    "msgpack",
)
HEADER = struct.Struct("!I")
_die_with_server = parent_death_signal_setter(signal.SIGKILL)
MAX_FDS = 3
REQUEST_TIMEOUT_S = 10.0


def listen(socket_path: str) -> socket.socket:
    """Bound before the preload, so that a worker Ray starts meanwhile waits in the
    backlog for its fork instead of finding no server and importing everything itself."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    os.chmod(socket_path, 0o600)
    listener.listen(128)
    return listener


def serve(listener: socket.socket, watch_fd: int) -> None:
    """Fork one worker per request until the driver's end of `watch_fd` closes (the
    driver exited or stopped the server): then every child still running is killed."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}  # child pid -> the connection of the client that asked for it
    by_connection: dict[socket.socket, int] = {}
    while True:
        readable, _, _ = select.select([listener, wake_read, watch_fd, *by_connection], [], [])
        if watch_fd in readable:
            break
        if wake_read in readable:
            os.read(wake_read, 4096)
            _reap(children, by_connection)
        if listener in readable:
            connection, _ = listener.accept()
            try:
                pid = _fork_worker(connection, [listener, *by_connection], (wake_read, wake_write, watch_fd))
            except OSError as error:  # a bad request or a failed fork: that client starts its worker itself
                print(f"fork server: no worker forked: {error!r}", file=sys.stderr, flush=True)
                pid = None
            if pid is None:
                connection.close()
            else:
                children[pid] = connection
                by_connection[connection] = pid
                try:
                    connection.sendall(f"pid {pid}\n".encode())
                except OSError:  # the client is gone already; _reap or the next select ends its worker
                    _kill(pid)
        for connection in [c for c in readable if c in by_connection]:
            # The client said nothing more after the request: readable means it is gone
            # (the raylet killed the process it started), so its worker goes too.
            pid = by_connection.pop(connection)
            children.pop(pid, None)
            connection.close()
            _kill(pid)
    for pid in children:
        _kill(pid)


def _fork_worker(connection: socket.socket, servers: list[socket.socket], inherited: tuple[int, ...]) -> int | None:
    connection.settimeout(REQUEST_TIMEOUT_S)  # a client that connects and says nothing cannot stall the server
    try:
        request, fds = _receive_request(connection)
    finally:
        connection.settimeout(None)
    if request is None or not _single_threaded():
        for fd in fds:
            os.close(fd)
        return None
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    try:
        # Its own process group, as the raylet gives every worker it starts: the raylet
        # ends a worker by signalling its group, which would otherwise be the server's,
        # and so every forked worker and the server itself.
        os.setpgid(0, 0)
        if _die_with_server is not None:  # a crashed server leaves no workers Ray cannot account for
            _die_with_server()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for server_socket in (*servers, connection):  # the server's, not the worker's
            server_socket.close()
        for fd in inherited:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _become(request)
    except BaseException as error:  # never return into the server's loop
        print(f"fork server: worker failed to start: {error!r}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


def _become(request: dict) -> None:
    """Turn this child into the worker the raylet asked for: its environment, its
    directory, its command line, then Ray's own worker entry point."""
    import runpy

    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    for entry in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:  # what a fresh interpreter would have put on the path
            sys.path.insert(1, entry)
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _receive_request(connection: socket.socket) -> tuple[dict | None, list[int]]:
    fds = array.array("i")
    message, ancillary, _, _ = connection.recvmsg(HEADER.size, socket.CMSG_LEN(MAX_FDS * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(message) < HEADER.size:
        return None, list(fds)
    (length,) = HEADER.unpack(message)
    body = b""
    while len(body) < length:
        chunk = connection.recv(length - len(body))
        if not chunk:
            return None, list(fds)
        body += chunk
    return json.loads(body), list(fds)


def _reap(children: dict[int, socket.socket], by_connection: dict[socket.socket, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is None:
            continue
        by_connection.pop(connection, None)
        ending = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        try:
            connection.sendall(f"{ending}\n".encode())
        except OSError:
            pass
        connection.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def preload(modules: tuple[str, ...] = PRELOAD) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as error:
            print(f"fork server: not preloading {name}: {error}", file=sys.stderr, flush=True)


def thread_count() -> int:
    """Threads of this process, native ones included (a BLAS or OpenMP pool that an
    import started): what a fork would leave behind in the child."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _single_threaded() -> bool:
    """Only a single-threaded process forks safely: a lock another thread held at the
    fork stays locked in the child for ever. Refused here, the request's worker starts
    as Ray starts it (the client falls back)."""
    threads = thread_count()
    if threads > 1:
        print(f"fork server: {threads} threads in this process; not forking (the worker starts unforked)",
              file=sys.stderr, flush=True)
    return threads == 1


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--watch-fd", type=int, required=True)
    args = parser.parse_args()
    listener = listen(args.socket)
    preload()
    if _cuda_initialized():
        # A CUDA context does not survive a fork: leave every worker to start itself.
        print("fork server: CUDA was initialised while preloading; not forking workers", file=sys.stderr, flush=True)
        return
    if not _single_threaded():  # every request would be refused: leave the workers to start themselves
        return
    serve(listener, args.watch_fd)
    # Its children are killed; tearing down thousands of imported modules would only
    # make the driver's shutdown wait.
    os._exit(0)


if __name__ == "__main__":
    main()
