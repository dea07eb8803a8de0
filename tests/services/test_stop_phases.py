"""A stop in every phase of a run (S-STOP-4), through the `ppo` flow with real Prefect
and real Ray actors: SIGTERM to this very process (the flow runs in its main thread, as
a deployment's flow run does) while Ray starts, during the evaluation in the
run's last iteration, during the restore of a rerun, during the final export and while a
block of iterations closes. Each
time the run ends Cancelled with the line saying what it kept and how to run it again
from the Prefect UI; the last finished iteration is committed; a stop in the last
iteration starts no export; the rerun that finds every iteration committed only
exports, adding no metrics row, and names the boundary it exported.

The hook that sends the signal is the test's (`signal_during`), wrapped around a named
point of the run; the run's code has none."""

from __future__ import annotations

import functools
import os
import signal

import pytest

from tests.conftest import TINY_PROFILE, short_run_overrides
from tests.support.helpers import metric_records as _records

RESUME_HINT = "run the deployment again with the same run name (or press Retry)"


def signal_during(monkeypatch, owner, name: str, when=lambda *args, **kwargs: True) -> list[int]:
    """SIGTERM to this process as `owner.name` starts (when `when(*args, **kwargs)` holds), once."""
    original = getattr(owner, name)
    sent: list[int] = []

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        if not sent and when(*args, **kwargs):
            sent.append(os.getpid())
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)
    return sent


def _stopped(overrides: list[str]) -> str:
    from prefect.exceptions import CancelledRun

    from flows.training import ppo

    with pytest.raises(CancelledRun) as cancelled:
        ppo(profile=TINY_PROFILE, overrides=overrides, critic_warmup_iterations=0)
    return str(cancelled.value)


def metric_records(run_dir) -> list[dict]:
    return _records(run_dir) if (run_dir / "metrics.jsonl").exists() else []


def _flow_runs(name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


def _committed(run_dir) -> list[int]:
    return sorted(int(p.parent.name.removeprefix("iter_")) for p in (run_dir / "checkpoints").glob("iter_*/_SUCCESS"))


def test_a_stop_in_every_phase_keeps_the_last_finished_iteration(
    prefect_api, ray_cluster, reused_role_processes, tiny_model_dir, tmp_path
):
    import flows.iteration_loop
    import flows.training
    import processes.ray_session
    from flows.flow_runner import FlowRunner

    overrides = short_run_overrides(tmp_path, tiny_model_dir) + [
        "job.name=stops", "rl.max_steps=1", "rl.save_final=false",
        "rl.validation.data.factory=data.synthetic:each_digit", "rl.validation.every=1",
        "rl.validation.before_training=false",
    ]
    run_dir = tmp_path / "stops"
    kept = f"committed {run_dir}/checkpoints/iter_000001; {RESUME_HINT} to resume from it"

    with pytest.MonkeyPatch.context() as patch:  # while Ray starts, before the first actor (tests/services/
        signal_during(patch, processes.ray_session, "connect_ray")  # test_group_stop.py: while they start, slow)
        line = _stopped(overrides)
    assert line == f"stopped by SIGTERM before its first iteration finished: nothing to keep; {RESUME_HINT} to start it"
    assert _committed(run_dir) == [] and metric_records(run_dir) == []

    with pytest.MonkeyPatch.context() as patch:  # evaluating the run's last iteration: committed, no export
        signal_during(patch, FlowRunner, "stage", lambda runner, body, *_, **__: body.__name__ == "evaluate")
        line = _stopped(overrides)
    assert line == f"stopped by SIGTERM after iteration 1: {kept}"
    assert _committed(run_dir) == [1] and [r["iteration"] for r in metric_records(run_dir)] == [1]
    assert "val/reward_mean" in metric_records(run_dir)[0] and not (run_dir / "final_model").exists()
    (block,) = _flow_runs("iteration 1 (stopped)")  # the block subflow says what ran, and that it stopped
    assert block.state.is_cancelled() and block.state.message.startswith("ran iteration 1 of iteration 1: the run")

    with pytest.MonkeyPatch.context() as patch:  # while the rerun restores that boundary: still no export
        signal_during(patch, flows.iteration_loop, "restore_roles")
        assert _stopped(overrides) == f"stopped by SIGTERM after iteration 1: {kept}"
    assert not (run_dir / "final_model").exists()

    with pytest.MonkeyPatch.context() as patch:  # the rerun only exports; stopped during it, the export is whole
        signal_during(patch, flows.training, "export")
        assert _stopped(overrides) == f"stopped by SIGTERM after iteration 1: {kept}"
    assert sorted(p.name for p in (run_dir / "final_model").iterdir()) == ["critic", "policy"]
    assert not list(run_dir.glob("final_model.*"))
    assert [r["iteration"] for r in metric_records(run_dir)] == [1]  # no row added by the reruns

    # Between two blocks, while the first one's subflow closes: no iteration is in
    # progress, so the one that finished is committed at once and no other runs (S-STOP-1).
    overrides = short_run_overrides(tmp_path, tiny_model_dir) + [
        "job.name=between", "rl.max_steps=2", "job.iterations_per_block=1", "rl.save_final=false",
    ]
    run_dir = tmp_path / "between"
    with pytest.MonkeyPatch.context() as patch:
        signal_during(patch, FlowRunner, "block_ran", lambda runner, last_block: not last_block)
        line = _stopped(overrides)
    assert line == (f"stopped by SIGTERM after iteration 1: committed {run_dir}/checkpoints/iter_000001; "
                    f"{RESUME_HINT} to resume from it")
    assert _committed(run_dir) == [1] and [r["iteration"] for r in metric_records(run_dir)] == [1]
