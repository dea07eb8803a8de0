"""The public paths the compat modules fall back to (S-DEP-2), run for real: a Ray outside
the range compat/ray_compat.py was written for starts its workers unforked and still runs
actors; a failing monitor kill leaves the rest of the shutdown to run; a Prefect
outside its compat module's range still gets its artifacts created."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT

DRIVER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from cli.environment import apply_default_environment
    apply_default_environment()
    from packaging.specifiers import SpecifierSet
    from compat import ray_compat
    from processes import ray_session

    written_for = ray_compat.WRITTEN_FOR
    ray_compat.WRITTEN_FOR = SpecifierSet("<2")  # as if the installed Ray were newer than the module
    session = ray_session.init_ray(num_cpus=1)
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self):
            return os.getpid()

    probe = Probe.remote()
    print("unforked workers run", session.fork_server is None and ray.get(probe.pid.remote(), timeout=120) > 0)

    # Back in range, with the monitor's kill failing: the rest of the shutdown still runs.
    ray_compat.WRITTEN_FOR = written_for
    from ray._private import node

    def broken_kill(self, check_alive=True):
        raise RuntimeError("monitor kill broke")

    node.Node.kill_monitor = broken_kill
    session.close()
    print("shut down", not ray.is_initialized(), flush=True)
    """
)


# A Ray of its own (about 10 s); the contract tests in tests/in_process/test_compat.py run by default.
@pytest.mark.slow
def test_rays_public_paths_start_run_and_stop_a_local_ray():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(REPO_ROOT)], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["unforked workers run True", "shut down True"], done.stderr[-3000:]
    assert "forking workers from the fork server was written for ray<2; workers start as Ray starts them" in (
        done.stderr)
    assert "could not stop the autoscaler monitor first: RuntimeError: monitor kill broke" in done.stderr


def test_an_artifact_is_created_through_prefects_public_path_too(prefect_api, monkeypatch):
    from packaging.specifiers import SpecifierSet
    from prefect import flow
    from prefect.artifacts import Artifact, MarkdownArtifact

    from compat import prefect_compat

    @flow
    def make_artifacts() -> None:
        prefect_compat.create_artifact(MarkdownArtifact(markdown="inside", key="compat-in-range"))
        monkeypatch.setattr(prefect_compat, "WRITTEN_FOR", SpecifierSet("<1"))
        prefect_compat.create_artifact(MarkdownArtifact(markdown="public", key="compat-public-path"))

    make_artifacts()
    assert Artifact.get("compat-in-range").data == "inside"
    assert Artifact.get("compat-public-path").data == "public"


def test_a_flows_logs_are_flushed_through_prefects_public_path_too(prefect_api, monkeypatch):
    """Outside compat/prefect_compat.py's range `APILogHandler.flush()` sends the queued
    logs (the events are left to Prefect's exit handlers)."""
    from packaging.specifiers import SpecifierSet
    from prefect import flow, get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.runtime import flow_run

    from compat import prefect_compat

    @flow
    def logs_then_flushes() -> str:
        get_run_logger().info("sent by the public flush")
        monkeypatch.setattr(prefect_compat, "WRITTEN_FOR", SpecifierSet("<1"))
        prefect_compat.drain_logs_and_events(timeout_s=5)
        with get_client(sync_client=True) as client:  # read before the flow's own end drains anything
            return " | ".join(log.message for log in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id]))))

    assert "sent by the public flush" in logs_then_flushes()


def test_the_served_stacks_compactor_keeps_final_states_only_and_every_state_outside_its_range(
    prefect_api, monkeypatch
):
    """deployments/history_compactor.py (S-FOOT-1, S-DEP-2) against a real Prefect API
    and its database: a finished block's completed task runs keep their Completed state
    and lose the Pending and Running ones; a failed task run keeps all three; outside
    compat/prefect_history.py's range, or with PPO_TASK_HISTORY=full, nothing is
    deleted."""
    from packaging.specifiers import SpecifierSet
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter
    from prefect.runtime import flow_run

    from compat import prefect_history
    from contracts.stage_names import BLOCK_FLOW
    from deployments import history_compactor
    from flows.recording import wait_until_recorded

    @task
    def stage(i: int) -> int:
        if i < 0:
            raise ValueError("a stage that fails")
        return i

    @flow(name=BLOCK_FLOW)
    def block(values: list[int]) -> str:
        for value in values:
            stage.submit(value).wait()
        return str(flow_run.id)

    run_id = block([1, 2, -1])
    wait_until_recorded(run_id, 3)

    def state_names() -> dict[str, list[str]]:
        with get_client(sync_client=True) as client:
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run_id]}))
            return {t.name: sorted(s.name for s in client.read_task_run_states(t.id)) for t in tasks}

    every, failed = sorted(["Pending", "Running", "Completed"]), sorted(["Pending", "Running", "Failed"])
    assert sorted(state_names().values()) == sorted([every, every, failed])
    monkeypatch.setenv("PPO_TASK_HISTORY", "full")
    assert history_compactor.main(["--once"]) == 0
    monkeypatch.delenv("PPO_TASK_HISTORY")
    monkeypatch.setattr(prefect_history, "WRITTEN_FOR", SpecifierSet("<1"))
    assert history_compactor.main(["--once"]) == 0
    assert sorted(state_names().values()) == sorted([every, every, failed])
    monkeypatch.undo()
    assert history_compactor.main(["--once"]) == 0
    assert sorted(state_names().values()) == sorted([["Completed"], ["Completed"], failed])
