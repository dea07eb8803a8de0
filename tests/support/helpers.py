"""Reading a finished run back the way a user would: metrics.jsonl and the committed
boundaries on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from checkpoint.digest import state_digest


def metric_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def metric_rows(run_dir: Path) -> int:
    """The whole rows of a run's metrics.jsonl so far, read while the run may be
    appending the next: a row still being written has no newline yet."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.exists() else 0


def last_iteration_seconds(run_dir: Path) -> float:
    """The newest whole row's iteration time (see `metric_rows`)."""
    text = (run_dir / "metrics.jsonl").read_text()
    return json.loads(text[: text.rindex("\n")].rsplit("\n", 1)[-1])["time/iteration_seconds"]


# Counters of one actor process: they restart with the process, so a resumed run
# legitimately reports different values.
PROCESS_LOCAL = {"perf/rollout_weight_loads"}


def without_timings(record: dict) -> dict:
    """Metrics that must repeat exactly; wall-clock figures and process-local
    counters never do."""
    return {
        k: v for k, v in record.items()
        if not k.startswith("time/") and not k.endswith("_seconds") and k not in PROCESS_LOCAL
    }


def boundary(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / f"iter_{iteration:06d}"


def weights_digest(role_dir: Path) -> str:
    return state_digest(load_file(role_dir / "model.safetensors"))


def optimizer_state(role_dir: Path) -> dict:
    return torch.load(role_dir / "optimizer.pt", weights_only=True)


def trainer_state(role_dir: Path) -> dict:
    return json.loads((role_dir / "trainer_state.json").read_text())


def run_dir_snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file with its size and mtime, to prove a refusal wrote nothing."""
    return {
        str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()
    }


def run_actor(run_name: str, actor: str):
    """A live run's actor by name: a named Ray actor, or the kept process serving
    under that name when the run takes its processes from a pool (tests/support/process_pool.py)."""
    import ray

    from tests.support.process_pool import active_pool

    namespace = f"ppo-{run_name}"
    pool = active_pool()
    kept = pool.find(namespace, actor) if pool is not None else None
    return kept if kept is not None else ray.get_actor(actor, namespace=namespace)


def signal_actor_after(run_dir: Path, rows: int, run_name: str, actor: str, signum: int, timeout: float = 300.0):
    """Start a thread that waits until the run has written `rows` metrics rows, then
    sends `signum` to the named role actor's process (SIGKILL: a crashed actor;
    SIGSTOP: a hung one). Returns the thread; its `pid` attribute is the process hit."""
    import os
    import threading
    import time

    import ray

    def hit() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= rows:
                handle = run_actor(run_name, actor)
                thread.pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
                os.kill(thread.pid, signum)
                thread.hit_at = time.monotonic()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=hit, daemon=True)
    thread.pid, thread.hit_at = None, None
    thread.start()
    return thread


def assert_ends_like_the_uninterrupted_run(
    run_dir: Path, overrides: list[str], straight_name: str, last_iteration: int,
    profile: str = "configs/ppo_tiny_cpu.py",
) -> None:
    """A run that was interrupted and resumed ends as if nobody had touched it: the
    uninterrupted run is made in process under `straight_name` (the flow computes
    exactly this: tests/services/test_flow_matches_in_process.py); the final policy
    and critic weights are bitwise equal and so is every metrics row (timings aside)."""
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths
    from flows.training import resolve_config

    config = resolve_config(profile, overrides, None, straight_name)
    paths = RunPaths.for_config(config)
    run_in_process(config, paths=paths)
    straight = Path(paths.run_dir)
    for role in ("policy", "critic"):
        assert weights_digest(boundary(run_dir, last_iteration) / role) == weights_digest(
            boundary(straight, last_iteration) / role
        ), role
    assert [without_timings(r) for r in metric_records(run_dir)] == [
        without_timings(r) for r in metric_records(straight)
    ]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited too
        return stat.read().split()[2] != "Z"


def offline_hub_snapshot(monkeypatch, hub: Path, repo_id: str, commit: str) -> Path:
    """A Hugging Face cache under `hub` holding one snapshot of `repo_id` at `commit`
    (its `main` ref pointing there), made the cache and offline for the test: a hub id
    resolves as it would on a machine that downloaded it, and never over the network."""
    import huggingface_hub.constants

    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return repo
