"""One writer per run directory (S-FAULT-4).

Two launches of one `job.name` would both write its boundaries, so one could hold one
run's policy and the other's critic. A run holds `<run_dir>/RUN_LOCK` while it writes;
a second launch is refused while the holder lives, and a dead holder's lock is taken
over, so a rerun after a crash just works (docs/architecture.md, "One writer per run").
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from files.durable import make_folders, replace_durably, sync_file, sync_folder
from contracts.timeouts import STARTUP_FLOOR_SECONDS

if TYPE_CHECKING:
    from configs.schema import PPOConfig
    from rundir.run_outputs import RunPaths

LOCK_NAME = "RUN_LOCK"
CLOSING_WAIT_S = 60.0  # how long a launch waits for a stopped run that is releasing its actors


def local_run_dir(run_dir: str) -> Path:
    """The run directory as a local path (the commit protocol already requires a
    local or shared filesystem, S-CKPT-7)."""
    return Path(run_dir.removeprefix("file://").removeprefix("local://"))


def stale_after(stage_timeout_s: float | None) -> float:
    """How old another host's heartbeat may be before its lock counts as dead: longer
    than any stage and than start-up may take, so a slow iteration is never mistaken
    for a dead run."""
    return max(STARTUP_FLOOR_SECONDS, 3 * (stage_timeout_s or 0.0))


class RunLocked(RuntimeError):
    """Another live run writes this run directory."""


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    process_start: str  # /proc/<pid>/stat field 22: tells a reused pid apart
    flow_run: str
    acquired_at: float
    heartbeat_at: float
    token: str  # tells this process's own lock apart when it renews or releases
    closing: bool = False  # stopped and committed: only releasing its actors and Ray now

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired_at))
        return f"host {self.host}, pid {self.pid}, flow run {self.flow_run} (since {started})"


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]  # a zombie has exited


def _alive(holder: LockHolder, stale_after_s: float) -> bool:
    """Same host: its pid with the same start time (a reused pid does not count).
    Another host (a shared output root): a heartbeat younger than `stale_after_s`."""
    if holder.host == socket.gethostname():
        return _process_start(holder.pid) == holder.process_start
    return time.time() - holder.heartbeat_at < stale_after_s


def _read(path: Path) -> LockHolder | None:
    try:
        return LockHolder(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as error:  # torn or foreign: treat as a dead holder
        return LockHolder("?", -1, "", f"unreadable lock ({error})", 0.0, 0.0, "")


def check_run_lock(run_dir: str | Path, stale_after_s: float = STARTUP_FLOOR_SECONDS) -> None:
    """Refuse early (before any service starts) when a live run holds `run_dir`; a run
    that has stopped and only releases its actors is waited for (a rerun pressed as soon
    as the UI shows Cancelled)."""
    path = Path(run_dir) / LOCK_NAME
    holder = _read(path)
    if holder is not None and _alive(holder, stale_after_s) and holder.closing:
        holder = _wait_while_closing(path, holder, stale_after_s)
    if holder is not None and _alive(holder, stale_after_s):
        raise RunLocked(
            f"{run_dir} is being written by a running run: {holder.describe()}; wait for it to end or stop it "
            "(Cancel in the Prefect UI, or kill that process), or choose another job.name"
        )


def _wait_while_closing(path: Path, holder: LockHolder, stale_after_s: float) -> LockHolder | None:
    """The holder now, once the closing one has let go, died or CLOSING_WAIT_S passed."""
    print(f"run lock: the stopped run {holder.describe()} is releasing its actors; waiting up to "
          f"{CLOSING_WAIT_S:g} s for it", file=sys.stderr, flush=True)
    deadline = time.monotonic() + CLOSING_WAIT_S
    current: LockHolder | None = holder
    while time.monotonic() < deadline:
        time.sleep(0.2)
        current = _read(path)
        if current is None or current.token != holder.token or not _alive(current, stale_after_s):
            break
    return current


class RunLock:
    """Held from acquire() to release(); renew() is the heartbeat."""

    def __init__(self, run_dir: str | Path, flow_run: str = "-", stale_after_s: float = STARTUP_FLOOR_SECONDS):
        self.path = Path(run_dir) / LOCK_NAME
        self.flow_run = flow_run
        self.stale_after_s = stale_after_s
        self.holder: LockHolder | None = None
        self.took_over: LockHolder | None = None

    @classmethod
    def of_run(cls, config: "PPOConfig", paths: "RunPaths", flow_run: str = "-") -> "RunLock":
        """The one way a launcher builds a run's lock (taken with acquire() or `with`):
        on the run directory, stale after longer than any of its stages may take."""
        return cls(local_run_dir(paths.run_dir), flow_run, stale_after_s=stale_after(config.rl.stage_timeout_seconds))

    def acquire(self) -> "RunLock":
        make_folders(str(self.path.parent))
        now = time.time()
        mine = LockHolder(
            socket.gethostname(), os.getpid(), _process_start(os.getpid()) or "", self.flow_run, now, now,
            uuid.uuid4().hex,
        )
        for _ in range(3):
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = _read(self.path)
                if held is not None and _alive(held, self.stale_after_s):
                    check_run_lock(self.path.parent, self.stale_after_s)  # raises naming a live holder
                    continue  # a stopped run that let go (or died) while it closed: race again
                # A dead run's lock: remove it and race for it again (O_EXCL decides).
                self.took_over = held
                try:
                    os.replace(self.path, self.path.with_name(f"{LOCK_NAME}.stale.{uuid.uuid4().hex}"))
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(descriptor, "w") as handle:
                json.dump(asdict(mine), handle)
            # Durable, so a power cut of a shared root's server cannot free a live run's lock.
            sync_file(str(self.path))
            sync_folder(str(self.path.parent))
            self.holder = mine
            for stale in self.path.parent.glob(f"{LOCK_NAME}.stale.*"):
                stale.unlink(missing_ok=True)
            return self
        raise RunLocked(f"{self.path}: could not take the run lock (another launch is taking it at the same time)")

    def renew(self, flow_run: str | None = None) -> None:
        """The heartbeat another host reads; written atomically beside the lock. A lock
        the command line took before its flow run existed gets the run's name here."""
        self.flow_run = flow_run or self.flow_run
        self._rewrite(flow_run=self.flow_run)

    def closing(self) -> None:
        """Stopped, committed and reported: a launch of this run waits for the close
        (actors, Ray) rather than being refused."""
        self._rewrite(closing=True)

    def _rewrite(self, **changes: Any) -> None:
        if self.holder is None:
            return
        self.holder = LockHolder(**{**asdict(self.holder), "heartbeat_at": time.time(), **changes})
        replace_durably(str(self.path), json.dumps(asdict(self.holder)))

    def release(self) -> None:
        """Only our own lock is removed: a run that lost it (taken over as stale
        from another host) must not delete the new holder's."""
        if self.holder is None:
            return
        held = _read(self.path)
        if held is not None and held.token == self.holder.token:
            self.path.unlink(missing_ok=True)
        self.holder = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
