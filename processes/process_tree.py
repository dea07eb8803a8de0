"""The processes a local Ray of a run started, found by a mark in their environment, so
that after a stop or a failure none is left running and nothing else is touched
(S-STOP-5). Every daemon, agent and worker of that Ray inherits the mark (processes/
ray_session.py puts it in the environment they start with), whoever its parent is by
then: Ray's dashboard agent and runtime-environment agent notice their raylet's end only
when they next poll it, and a dead raylet's workers are handed to the init process.

A process is named by its pid and its start time (in clock ticks since boot), so a pid
the kernel gave to a new process meanwhile is never signalled."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

MARK_ENV = "PPO_RAY_PROCESSES"  # a fresh token per local Ray, in the environment of each of its processes

Proc = tuple[int, int]  # (pid, start time)


def _start_time(pid: int) -> int | None:
    """The start time of a live process, None when it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    return None if fields[0] in ("Z", "X") else int(fields[19])


def marked(mark: str) -> set[Proc]:
    """Live processes, other than this one, whose environment holds `MARK_ENV=mark`
    (only this user's processes can be read, and only theirs can hold it)."""
    return with_environment(f"{MARK_ENV}={mark}")


def with_environment(entry: str) -> set[Proc]:
    """Live processes, other than this one, whose environment holds `entry` (`KEY=value`),
    as it was when each process started."""
    needle = entry.encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environment = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if needle in environment.split(b"\0") and (start := _start_time(int(name))) is not None:
            found.add((int(name), start))
    return found


def alive(processes: set[Proc]) -> set[Proc]:
    return {(pid, start) for pid, start in processes if _start_time(pid) == start}


def end_processes(processes: set[Proc], wait_s: float) -> set[Proc]:
    """Wait up to `wait_s` for `processes` to end by themselves, then SIGKILL the ones
    left. Returns the ones that had to be killed."""
    deadline = time.monotonic() + wait_s
    left = alive(processes)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def terminate(processes: set[Proc], wait_s: float) -> set[Proc]:
    """SIGTERM each of `processes` still alive, then as `end_processes`."""
    for pid, _ in alive(processes):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    return end_processes(processes, wait_s)
