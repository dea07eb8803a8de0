"""Never outrun the server's recording of task runs (S-OPS-1: every task run is
recorded): the server drops task-run events that overflow its in-memory queue, so each
block ends by waiting until the server holds every task run it ran (docs/architecture.md,
"How a run starts"). Also the API reads that list a run's flow and task runs, and the
upkeep of the database behind them: a recorded block's history compacted, and the disk
it is on checked before the next block (S-FOOT-1).
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.logging import get_logger

from compat.prefect_history import (
    HistoryCompactionUnavailable, PrefectDatabase, compact_flow_run, compaction_wanted,
)

RECORDING_TIMEOUT_S = 300.0
# The server's recorder writes queued task runs on a short interval (cli/environment.py):
# a short, even recheck ends the wait soon after the write, where a doubling delay
# overshot it on every block and at every run's end; a count is cheap for the server.
RECHECK_S = 0.1


def run_flow_runs(flow_run_id: UUID) -> FlowRunFilter:
    """A training run's flow runs: the `ppo` flow run and its block subflow runs."""
    return FlowRunFilter(
        operator="or_",
        id=FlowRunFilterId(any_=[flow_run_id]),
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
    )


def count_task_runs(client: Any, flow_runs: FlowRunFilter, finished_only: bool = False) -> int:
    """Task runs the server has recorded in `flow_runs` (only those in a final state
    with `finished_only`), by the API's own count (no page of rows is read)."""
    body: dict[str, Any] = {"flow_runs": flow_runs.model_dump(mode="json", exclude_unset=True)}
    if finished_only:
        final = TaskRunFilterStateType(any_=[StateType.COMPLETED, StateType.FAILED, StateType.CRASHED])
        # `name=None` spelled out: Prefect 3.7 (the vLLM environment, `make test-vllm`)
        # declares the field without a default.
        body["task_runs"] = TaskRunFilter(state=TaskRunFilterState(type=final, name=None)).model_dump(
            mode="json", exclude_unset=True
        )
    response = client.request("POST", "/task_runs/count", json=body)
    response.raise_for_status()
    return int(response.json())


def wait_until_recorded(flow_run_id: UUID, expected: int, timeout_s: float = RECORDING_TIMEOUT_S) -> float:
    """Block until the server holds `expected` finished task runs of `flow_run_id`;
    returns the seconds waited. Past `timeout_s` it logs a warning and returns:
    the history is a view, and training never waits on it for ever."""
    started = time.monotonic()
    flow_runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        while True:
            recorded = count_task_runs(client, flow_runs, finished_only=True)
            waited = time.monotonic() - started
            if recorded >= expected:
                return waited
            if waited > timeout_s:
                get_logger("ppo.recording").warning(
                    f"the Prefect server recorded {recorded} of {expected} task runs of flow run {flow_run_id} "
                    f"within {timeout_s:g} s; going on without waiting longer"
                )
                return waited
            time.sleep(RECHECK_S)


MIN_FREE_MIB = 64  # a block of the tiny profile adds about 1 MiB (docs/performance.md); far from this
MIB = 1024 * 1024


class PrefectDatabaseFull(RuntimeError):
    """The disk of the Prefect database this process writes to is (nearly) full."""


def database_space_problem() -> str | None:
    """Why the next block should not start, when the SQLite database of this run's API
    is on a disk with less than MIN_FREE_MIB left: Prefect's writes would fail there one
    by one (a task run never recorded, a lost log, a flow run that cannot end), so the
    run stops first with the database and the settings that bound it named. None when
    there is room, or when the database is not here (a PostgreSQL server says itself)."""
    import shutil

    path = PrefectDatabase.of_settings().sqlite_path()
    if path is None or not path.is_file():
        return None
    free = shutil.disk_usage(path.parent).free
    if free >= MIN_FREE_MIB * MIB:
        return None
    return (
        f"the Prefect database {path} has {free / MIB:.0f} MiB left on its disk (the run needs {MIN_FREE_MIB}): free "
        "space there, or bound what the database keeps (PPO_TASK_HISTORY=compact, the default; "
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED=false; docs/prefect-ui.md, \"What a long run keeps\"); "
        "a rerun resumes from the last committed boundary"
    )


_UNAVAILABLE_SAID: set[str] = set()


def compact_recorded(flow_run_id: UUID) -> int:
    """A recorded block's superseded task-run states deleted (compat/prefect_history.py);
    returns how many. Only where this process reaches the API's database (its own
    temporary API, `make serve` on SQLite); a served stack's compactor does the rest
    (deployments/history_compactor.py). Best effort, as the rest of the run's history:
    a database it cannot compact keeps every state, said once in the run's log."""
    import os

    if not compaction_wanted(os.environ):
        return 0
    database = PrefectDatabase.of_settings()
    if not database.here():
        return 0
    try:
        return compact_flow_run(database, flow_run_id)
    except Exception as error:  # noqa: BLE001  (the history is a view: training goes on)
        reason = str(error) if isinstance(error, HistoryCompactionUnavailable) else type(error).__name__
        if reason not in _UNAVAILABLE_SAID:
            _UNAVAILABLE_SAID.add(reason)
            get_logger("ppo.recording").warning(f"finished task runs keep every state ({reason})")
        return 0
