"""What the elastic rollout tests share: a fault put inside one rollout engine's
`generate` from outside the production code, and the comparison of a disturbed run with
its undisturbed twin (S-ELASTIC-1): metrics rows, experience files and every checkpoint
file, with wall-clock figures and the fault counters aside."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from tests.support.helpers import alive, metric_records, run_actor, without_timings

FAULT_KEYS = {"fault/rollout_engines_lost", "fault/rollout_replace_seconds"}
# Files whose JSON carries wall-clock figures (a row, the in-flight batch's stage
# summaries) and the marker that records their digests: compared without those.
TIMED_JSON = {"metrics_row.json", "summaries.json"}


def fault_inside_generate(run_name: str, engine: int, iteration: int, signum: int, timeout: float = 300.0):
    """Start a thread that finds rollout engine `engine` of the live run `run_name` as
    soon as it exists and arms it: when its `generate` reaches the prompts of
    `iteration`, the engine's process sends itself `signum` (SIGKILL: a crash inside
    generation; SIGSTOP: a hang). The thread's `pid` is the engine's process and its
    `armed` event is set once the fault is in place."""

    def arm(role, at=iteration, signum=signum):
        import os as os_inside

        original = role._sample

        def faulty(prompts, *args, **kwargs):
            if prompts.iteration == at:
                os_inside.kill(os_inside.getpid(), signum)
            return original(prompts, *args, **kwargs)

        role._sample = faulty
        return os_inside.getpid()

    return _arm_when_found(run_name, engine, arm, timeout)


def fault_inside_load_weights(run_name: str, engine: int, version: int, signum: int, timeout: float = 300.0):
    """As `fault_inside_generate`, inside the weight load that brings policy_version
    `version` (one after another, as a synchronous run loads them)."""

    def arm(role, at=version, signum=signum):
        import os as os_inside

        # Ray calls an actor's methods as its class defines them, so the fault goes into
        # the engine the role's load_weights calls, while the role still holds at - 1.
        original = role.engine.load_weights

        def faulty(buckets, *args, **kwargs):
            if role.policy_version == at - 1:
                os_inside.kill(os_inside.getpid(), signum)
            return original(buckets, *args, **kwargs)

        role.engine.load_weights = faulty
        return os_inside.getpid()

    return _arm_when_found(run_name, engine, arm, timeout)


def _arm_when_found(run_name: str, engine: int, arm, timeout: float):
    import ray

    actor = "rollout" if engine == 0 else f"rollout-rank{engine}"

    def find_and_arm() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                handle = run_actor(run_name, actor)
            except ValueError:  # not created yet
                time.sleep(0.05)
                continue
            thread.pid = ray.get(handle.__ray_call__.remote(arm))
            thread.armed.set()
            return

    thread = threading.Thread(target=find_and_arm, daemon=True)
    thread.pid, thread.armed = None, threading.Event()
    thread.start()
    return thread


def comparable_row(record: dict) -> dict:
    return {k: v for k, v in without_timings(record).items() if k not in FAULT_KEYS}


def _without_times(value):
    if isinstance(value, dict):
        return {
            k: _without_times(v) for k, v in value.items()
            if not (k.startswith("time/") or k.endswith("_seconds") or k in FAULT_KEYS or k == "fault/rollout_events")
            and k != "perf/rollout_weight_loads"
        }
    return value


def assert_same_run(run_dir: Path, twin_dir: Path) -> None:
    """Rows, experience files and every checkpoint file of `run_dir` equal `twin_dir`'s:
    byte for byte, except the JSON that holds wall-clock figures (compared without
    them) and each `_SUCCESS`, whose digests of those files differ (compared without)."""
    assert [comparable_row(r) for r in metric_records(run_dir)] == [comparable_row(r) for r in metric_records(twin_dir)]
    for folder in ("experience", "checkpoints"):
        mine = sorted(p.relative_to(run_dir / folder) for p in (run_dir / folder).rglob("*") if p.is_file())
        theirs = sorted(p.relative_to(twin_dir / folder) for p in (twin_dir / folder).rglob("*") if p.is_file())
        assert mine == theirs, folder
        for relative in mine:
            got, want = run_dir / folder / relative, twin_dir / folder / relative
            if relative.name in TIMED_JSON:
                assert _without_times(json.loads(got.read_text())) == _without_times(json.loads(want.read_text()))
            elif relative.name == "_SUCCESS":
                assert _marker(got) == _marker(want), relative
            else:
                assert got.read_bytes() == want.read_bytes(), relative


def _marker(path: Path) -> dict:
    marker = json.loads(path.read_text())
    files = {name: entry for name, entry in marker.get("files", {}).items() if Path(name).name not in TIMED_JSON}
    return {**{k: v for k, v in marker.items() if k != "files"}, "files": files}


def release(pid: int | None) -> None:
    """A stopped engine left behind by a failed test: killed."""
    if pid and alive(pid):
        os.kill(pid, signal.SIGKILL)
