"""The served stack's history compactor (`make serve`; S-FOOT-1): every minute, the
block subflow runs that ended since the last pass get their completed task runs'
superseded states deleted (compat/prefect_history.py), as a command-line run's own
process does for its embedded API. It runs beside the server because only the server
holds the database's URL (a PostgreSQL password never reaches a worker or a flow run).

    python -m deployments.history_compactor [--every 60]

Reads the database from the server's settings (PREFECT_SERVER_DATABASE_CONNECTION_URL,
else the SQLite file under PREFECT_HOME) and the API from PREFECT_API_URL. With
`PPO_TASK_HISTORY=full` in the stack's environment it exits at once: every state kept.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import uuid

from compat.prefect_history import HistoryCompactionUnavailable, PrefectDatabase, compact_flow_run, compaction_wanted
from contracts.stage_names import BLOCK_FLOW

OVERLAP = datetime.timedelta(minutes=5)  # a block that ended just before the last pass began


def ended_blocks(client: object, since: datetime.datetime | None) -> list[uuid.UUID]:
    """The block subflow runs in a final state that ended after `since` (all when None)."""
    from prefect.client.schemas.filters import (
        FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterEndTime, FlowRunFilterState, FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    final = [StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED, StateType.CRASHED]
    runs = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=final)),
                         end_time=FlowRunFilterEndTime(after_=since) if since else None)
    found, offset = [], 0
    while True:
        page = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[BLOCK_FLOW])),
                                     flow_run_filter=runs, limit=200, offset=offset)
        found += [run.id for run in page]
        if len(page) < 200:
            return found
        offset += 200


def compact_pass(client: object, database: PrefectDatabase, since: datetime.datetime | None) -> tuple[int, int]:
    """(blocks, states deleted) in one pass."""
    blocks = ended_blocks(client, since)
    return len(blocks), sum(compact_flow_run(database, block) for block in blocks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deployments.history_compactor", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--every", type=float, default=60.0, help="seconds between passes")
    parser.add_argument("--once", action="store_true", help="one pass over every ended block, then exit")
    args = parser.parse_args(argv)
    if not compaction_wanted(os.environ):
        print("history compactor: every task-run state is kept", flush=True)
        return 0
    from prefect.client.orchestration import get_client

    database, since = PrefectDatabase.of_settings(), None
    while True:
        began = datetime.datetime.now(datetime.timezone.utc)
        try:
            with get_client(sync_client=True) as client:
                blocks, deleted = compact_pass(client, database, since)
            if deleted:
                print(f"history compactor: {deleted} superseded task-run states of {blocks} blocks deleted", flush=True)
            since = began - OVERLAP
        except HistoryCompactionUnavailable as error:
            print(f"history compactor: every task-run state is kept: {error}", file=sys.stderr, flush=True)
            return 1
        except Exception as error:  # noqa: BLE001  (the server restarting: the next pass tries again)
            print(f"history compactor: pass failed ({type(error).__name__}); trying again", file=sys.stderr, flush=True)
        if args.once:
            return 0
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
