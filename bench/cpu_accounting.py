"""CPU seconds spent by each kind of process a flow run starts (Linux /proc only).

Why: on a small machine the orchestration's cost is not only the latency the flow
adds between stages but also the CPU its helpers burn while the actors compute: the
Prefect API server (task-run events, logs), Ray's own daemons, and the driver process
that runs the flow.
Every CPU second they take is one the role actors wait for. A background thread
samples the cumulative CPU time of this process and all its descendants, so actors
that are killed at the end of the run are still counted up to their last sample.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of one process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_group(pid: int, root: int, cmdline: str, parent_group: str | None = None) -> str:
    if pid == root:
        return "driver process"
    if "processes.fork_server" in cmdline:
        # A forked role process carries the server's command line until Ray retitles it.
        return "ray actors" if parent_group == "fork server" else "fork server"
    if cmdline.startswith("ray::") or "default_worker.py" in cmdline:
        # A worker is first seen as default_worker.py, later retitled ray::<Role>.
        return "ray actors"
    if "processes.temporary_server" in cmdline:  # the run's temporary Prefect API (uvicorn)
        return "prefect server"
    if "prefect" in cmdline and ("server" in cmdline or "uvicorn" in cmdline):
        return "prefect server"
    if any(
        name in cmdline
        for name in ("raylet", "gcs_server", "ray/dashboard", "log_monitor", "ray/_private", "runtime_env")
    ):
        return "ray system"
    return "other"


@dataclass
class CpuSampler:
    """Samples every `interval` seconds between start() and stop(); `window_cpu`
    returns CPU seconds per group spent between two marks."""

    interval: float = 0.3
    samples: list[tuple[float, dict[int, float]]] = field(default_factory=list)
    groups: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _descendants(self, root: int) -> list[int]:
        parents: dict[int, int] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = read_stat(int(name))
                if stat:
                    parents[int(name)] = stat[0]
        found, frontier = [root], [root]
        while frontier:
            frontier = [pid for pid, parent in parents.items() if parent in frontier and pid not in found]
            found.extend(frontier)
        return found

    def _sample(self, root: int) -> None:
        cpu: dict[int, float] = {}
        for pid in self._descendants(root):
            stat = read_stat(pid)
            if stat is None:
                continue
            cpu[pid] = stat[1]
            if pid not in self.groups:
                self.groups[pid] = process_group(pid, root, _cmdline(pid), self.groups.get(stat[0]))
        self.samples.append((time.monotonic(), cpu))

    def start(self, root: int | None = None) -> "CpuSampler":
        """Samples `root` (default: this process) and its descendants."""
        root = os.getpid() if root is None else root

        def loop() -> None:
            while not self._stop.is_set():
                self._sample(root)
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def window_cpu(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per group between monotonic times `start` and `end` (the
        samples nearest inside the window; a process seen only part of the window
        counts from its first to its last sample inside it)."""
        inside = [(t, cpu) for t, cpu in self.samples if start <= t <= end]
        if len(inside) < 2:
            return {}
        first_seen: dict[int, float] = {}
        last_seen: dict[int, float] = {}
        for _, cpu in inside:
            for pid, seconds in cpu.items():
                first_seen.setdefault(pid, seconds)
                last_seen[pid] = seconds
        totals: dict[str, float] = {}
        for pid, seconds in last_seen.items():
            group = self.groups.get(pid, "other")
            totals[group] = totals.get(group, 0.0) + seconds - first_seen[pid]
        totals["wall"] = inside[-1][0] - inside[0][0]
        return totals
