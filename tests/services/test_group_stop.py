"""A SIGTERM to the run's whole process group, as Kubernetes, `timeout` and most shells
send it, with `PPO_FORK_WORKERS=0` (every worker started by the raylet as plain Python)
and with the default forked workers: the run keeps the iteration it finished, exits 143
with the resume line, and within a few seconds none of the processes it started is left
(S-STOP-5). Counted by a mark in their environment, which every process of the run
inherits and nothing else has. (With `PPO_FORK_WORKERS=0` the raylet's agents used to be
in the run's group: a signal while the actors started killed them, the raylet died with
them, and the run hung past its grace. The GCS and the raylet themselves stayed in it
until they were given sessions of their own: the raylet answers SIGTERM by sending SIGTERM
to every worker, so some tries lost the iteration.) A SIGKILL to the group, a Prefect
worker's after its grace, still leaves nothing of the run behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from processes.process_tree import with_environment
from tests.conftest import REPO_ROOT, TINY_PROFILE, short_run_overrides
from tests.support.helpers import metric_rows

pytestmark = pytest.mark.slow

MARK = "PPO_TEST_RUN_MARK"


def marked(mark: str) -> set[int]:
    """Live processes whose environment holds `MARK=mark`."""
    return {pid for pid, _ in with_environment(f"{MARK}={mark}")}


def _start_run(fork_workers: str, mark: str, tiny_model_dir: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A command-line run leading a process group and session of its own, as a Prefect
    process worker or a terminal starts it; its output goes to run.log."""
    overrides = short_run_overrides(tmp_path, tiny_model_dir) + [
        "job.name=group", "rl.max_steps=40", "rl.save_every=100",
        # Iterations of a few seconds, so the signal comes while the actors work.
        "rl.batch_size=128", "rl.minibatch_size=64", "rl.micro_batch_size=64", "rl.epochs=2",
    ]
    env = {**os.environ, "PPO_FORK_WORKERS": fork_workers, MARK: mark}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "run.log"
    run = subprocess.Popen(
        [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *overrides], cwd=REPO_ROOT, env=env,
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    return run, log


def _left_running(mark: str, seconds: float) -> list[bytes]:
    """The command lines of the marked processes still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in marked(mark)]


@pytest.mark.parametrize(
    ("fork_workers", "moment"),
    [("0", "while the actors start"), ("0", "in an iteration"), ("1", "while the actors start"),
     ("1", "in an iteration")],
)
def test_a_group_sigterm_keeps_what_finished_and_leaves_nothing(
    fork_workers, moment, stop_attempt, tiny_model_dir, tmp_path
):
    mark = uuid.uuid4().hex
    run, log = _start_run(fork_workers, mark, tiny_model_dir, tmp_path)
    run_dir = tmp_path / "group"
    try:
        if moment == "in an iteration":
            while metric_rows(run_dir) < 1 and run.poll() is None:
                time.sleep(0.05)
            time.sleep(0.5)  # into the next iteration
        else:  # the raylet's agents, once in the run's group, died and took the raylet with them
            while "launched the role actors" not in log.read_text() and run.poll() is None:
                time.sleep(0.05)
        running = marked(mark)
        os.killpg(run.pid, signal.SIGTERM)  # the run's group: the run and whatever stayed in it
        signalled = time.monotonic()
        assert run.wait(timeout=60) == 143, log.read_text()[-3000:]
        assert time.monotonic() - signalled < 30  # job.stop_grace_seconds
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    done = metric_rows(run_dir)
    last = log.read_text().strip().splitlines()[-1]
    if moment == "in an iteration":
        assert last.startswith(f"stopped by SIGTERM after iteration {done}: committed {run_dir}/checkpoints/"), last
        assert (run_dir / "checkpoints" / f"iter_{done:06d}" / "_SUCCESS").is_file()
    else:
        assert done == 0 and last.startswith("stopped by SIGTERM before its first iteration finished"), last
    # The run, its temporary API, its Ray's daemons and agents and the actors started so far: all gone.
    assert len(running) >= 6, running
    assert _left_running(mark, 5) == []


def test_a_group_sigkill_leaves_nothing_of_the_run(stop_attempt, tiny_model_dir, tmp_path):
    """S-STOP-5: a Prefect worker's SIGKILL after its grace reaches only the run's own
    process now that Ray's daemons are out of its group: the kernel still ends each of
    them with it (Ray's PR_SET_PDEATHSIG), and with them the agents and workers."""
    mark = uuid.uuid4().hex
    run, log = _start_run("1", mark, tiny_model_dir, tmp_path)
    try:
        while metric_rows(tmp_path / "group") < 1 and run.poll() is None:
            time.sleep(0.05)
        running = marked(mark)
        os.killpg(run.pid, signal.SIGKILL)
        assert run.wait(timeout=30) == -signal.SIGKILL, log.read_text()[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert len(running) >= 6, running
    assert _left_running(mark, 10) == []


def test_a_group_sigterm_to_a_run_that_joined_a_cluster_stops_it_and_leaves_the_cluster_alone(
    ray_cluster, tiny_model_dir, tmp_path
):
    """S-STOP-5, a joined cluster (this session's Ray, as `RAY_ADDRESS`): the run commits
    and exits 143; its actors are gone from the cluster; the cluster's own daemons are
    untouched and it still runs work."""
    import ray

    from processes.process_tree import marked

    cluster = marked(ray_cluster.mark)
    daemons = {proc for proc in cluster if Path(f"/proc/{proc[0]}/cmdline").read_bytes().split(b"\0")[0].endswith(
        (b"gcs_server", b"raylet"))}
    assert len(daemons) == 2, cluster
    overrides = short_run_overrides(tmp_path, tiny_model_dir) + ["job.name=joined", "rl.max_steps=40",
                                                                 "rl.save_every=100"]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    log = tmp_path / "run.log"
    run = subprocess.Popen(
        [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *overrides], cwd=REPO_ROOT, env=env,
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    run_dir = tmp_path / "joined"
    try:
        while metric_rows(run_dir) < 1 and run.poll() is None:
            time.sleep(0.05)
        os.killpg(run.pid, signal.SIGTERM)
        assert run.wait(timeout=60) == 143, log.read_text()[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    done = metric_rows(run_dir)
    assert (run_dir / "checkpoints" / f"iter_{done:06d}" / "_SUCCESS").is_file(), log.read_text()[-3000:]
    assert [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "ppo-joined"] == []
    from processes.process_tree import alive

    assert alive(daemons) == daemons  # the cluster's GCS and raylet
    assert ray.get(ray.remote(lambda: 42).options(num_cpus=0).remote()) == 42
