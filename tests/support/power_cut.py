"""Mounting tests/support/volatile_fs.py and cutting its power from a test (S-CKPT-9).

    with VolatileMount(tmp_path) as mount:       # mount.path: a folder that forgets unsynced writes
        ...write a run there...
        mount.power_cycle()                      # cut now, then mount again: what survived
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def fuse_missing() -> str | None:
    """Why a FUSE filesystem cannot be mounted here, or None. A test skips naming this,
    never silently (the project installs fuse3 and mfusepy: Makefile, requirements.lock)."""
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (Debian package fuse3: `make setup` installs it)"
    try:
        import mfusepy  # noqa: F401  (loads libfuse3 through ctypes)
    except ImportError as error:
        return f"the FUSE binding mfusepy does not import ({error}); `make setup` installs it"
    except OSError as error:
        return f"libfuse3 does not load ({error}); Debian package fuse3"
    return None


class VolatileMount:
    """One volatile filesystem at `self.path`, its durable state kept in `image`
    between mounts; `log` collects every changing operation (`N op path`); `metadata`:
    "strict" or "journaled" (tests/support/volatile_fs.py)."""

    def __init__(self, folder: Path, log: Path | None = None, metadata: str = "strict"):
        self.metadata = metadata
        self.image = folder / "image"
        self.path = folder / "mnt"
        self.log = log
        self.server: subprocess.Popen[bytes] | None = None
        self.image.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)

    def mount(self, cut_at: int | None = None) -> "VolatileMount":
        command = [sys.executable, "-m", "tests.support.volatile_fs", str(self.image), str(self.path),
                   "--metadata", self.metadata]
        if cut_at is not None:
            command += ["--cut-at", str(cut_at)]
        if self.log is not None:
            command += ["--log", str(self.log)]
        self.server = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.path):
            if self.server.poll() is not None or time.monotonic() > deadline:
                error = self.server.stderr.read().decode() if self.server.poll() is not None else "timed out"
                raise RuntimeError(f"volatile_fs did not mount at {self.path}: {error}")
            time.sleep(0.02)
        return self

    def unmount(self) -> None:
        """The server writes the surviving state into the image as it exits."""
        if self.server is None:
            return
        if subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], capture_output=True)  # a file still open
        try:
            self.server.wait(timeout=60)
        finally:
            if self.server.poll() is None:
                self.server.kill()
            self.server = None

    def cut(self) -> None:
        """Power off now: every write not yet fsynced is gone, every later operation fails."""
        try:
            (self.path / ".power-cut").touch()
        except OSError:
            pass

    def power_cycle(self) -> None:
        self.cut()
        self.unmount()
        self.mount()

    def __enter__(self) -> "VolatileMount":
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()


# -- the operations of a run, and the moments of a commit ---------------------------


def read_operations(log: Path) -> list[tuple[int, str, str]]:
    """`(number, op, path)` of every changing operation the log holds, in order."""
    rows = []
    for line in log.read_text().splitlines():
        number, op, path = line.split(" ", 2)
        if op != "CUT":
            rows.append((int(number), op, path))
    return rows


def commit_operations(operations: list[tuple[int, str, str]], iteration: int) -> list[tuple[int, str, str]]:
    """The operations of the commit of `iteration`: from the first that touches its
    boundary to the last of the unbroken run under checkpoints/ that follows
    (role saves, marker, pointer, retention)."""
    name = f"/checkpoints/iter_{iteration:06d}"
    start = next(index for index, (_, _, path) in enumerate(operations) if name in path)
    end = start
    while end + 1 < len(operations) and "/checkpoints" in operations[end + 1][2]:
        end += 1
    return operations[start : end + 1]


def commit_moments(operations: list[tuple[int, str, str]], iteration: int) -> dict[str, int]:
    """The operation numbers to cut at for each named moment of one commit."""
    commit = commit_operations(operations, iteration)
    name = f"iter_{iteration:06d}"
    in_flight = [n for n, _, path in commit if f"{name}/in_flight/" in path]  # one step off only

    def middle(matches: list[int]) -> int:
        assert matches, f"no such operation in the commit of {name}"
        return matches[len(matches) // 2]

    return ({"in-flight save": middle(in_flight)} if in_flight else {}) | {
        "policy save": middle([n for n, _, path in commit if f"{name}/policy/" in path]),
        "critic save": middle([n for n, _, path in commit if f"{name}/critic/" in path]),
        "data save": middle([n for n, _, path in commit if f"{name}/data/" in path]),
        "saves to marker": middle([n for n, op, path in commit if op == "create" and "_SUCCESS" in path][:1]),
        "marker to pointer": middle(
            [n for n, op, path in commit if op == "create" and "latest_checkpoint.txt" in path][:1]
        ),
        "retention": middle([n for n, _, path in commit if "/checkpoints/iter_" in path and f"{name}/" not in path]),
    }


def export_operations(operations: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The final export's operations (`final_model/`, written aside and renamed)."""
    return [row for row in operations if "/final_model" in row[2]]


def committed_by(operations: list[tuple[int, str, str]], cut_at: int) -> int:
    """The newest iteration whose commit finished (pointer renamed and its folder
    synced) before operation `cut_at`: the boundary a cut there must not lose."""
    marked = pointed = committed = 0
    for number, op, path in operations:
        if number >= cut_at:
            break
        if op == "rename" and path.endswith("/_SUCCESS"):
            marked = int(path.rsplit("iter_", 1)[1].split("/")[0])
        elif op == "rename" and path.endswith("/latest_checkpoint.txt"):
            pointed = marked
        elif op == "fsyncdir" and path.endswith("/checkpoints"):
            committed = pointed
    return committed


# -- a short run of the CPU profile into the volatile filesystem ---------------------

RUN_NAME = "cut"


def power_cut_config(root: Path | str, model_dir: str, steps: int, *extra: str):  # -> PPOConfig
    from configs.loading import load_config
    from tests.conftest import TINY_PROFILE, short_run_overrides

    return load_config(TINY_PROFILE, [
        *short_run_overrides(root, model_dir), f"job.name={RUN_NAME}", "job.trackers=[]", "rl.save_every=1",
        f"rl.max_steps={steps}", *extra,
    ])


def run_steps(root: str, model_dir: str, steps: int, *extra: str) -> None:
    """Run (or resume) the run in `root` to iteration `steps`, saving every iteration."""
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths

    config = power_cut_config(root, model_dir, steps, *extra)
    run_in_process(config, paths=RunPaths.for_config(config), resume=True)
