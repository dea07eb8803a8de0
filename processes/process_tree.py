"""The processes a run started, found through /proc, so that after a stop or a failure
none is left running and nothing else is touched (S-STOP-5). Ray's dashboard agent and
runtime-environment agent notice their raylet's end only when they next poll it, seconds
later; a killed driver leaves them to the init process.

A process is named by its pid and its start time (in clock ticks since boot), so a pid
the kernel gave to a new process meanwhile is never signalled."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

Proc = tuple[int, int]  # (pid, start time)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None when it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _table() -> dict[int, tuple[int, int]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            table[int(entry)] = found
    return table


def children(pid: int | None = None) -> set[Proc]:
    """The live direct children of `pid` (default: this process)."""
    parent = os.getpid() if pid is None else pid
    return {(child, start) for child, (ppid, start) in _table().items() if ppid == parent}


def with_descendants(roots: set[Proc]) -> set[Proc]:
    """`roots` still alive, and every live process below them."""
    table = _table()
    found = {(pid, start) for pid, start in roots if table.get(pid, (0, None))[1] == start}
    frontier = {pid for pid, _ in found}
    while frontier:
        below = {(pid, start) for pid, (ppid, start) in table.items() if ppid in frontier} - found
        found |= below
        frontier = {pid for pid, _ in below}
    return found


def alive(processes: set[Proc]) -> set[Proc]:
    return {(pid, start) for pid, start in processes if (_stat(pid) or (0, None))[1] == start}


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
