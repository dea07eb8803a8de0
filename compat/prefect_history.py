"""A finished block's task-run history, compacted in Prefect's own database (S-FOOT-1).

Every stage is its own task run, and Prefect records three states for each (Pending,
Running, Completed): two thirds of what a long run adds to the database. Once a block
has ended and its task runs are recorded, the Pending and Running rows of its completed
task runs say nothing the UI shows: the task run keeps its final state, start and end
time and run time. Prefect has no API that deletes a state, so this deletes them in
its tables: the one private internal of this module, written against the schema of
`WRITTEN_FOR` and probed before each use. Outside it, or on a schema without the
columns, nothing is deleted and the history stays whole (the public path). A task run
that did not complete keeps all its states.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from packaging.specifiers import SpecifierSet

from compat.versions import within

WRITTEN_FOR = SpecifierSet(">=3.7,<3.10")
# The columns the statement below reads, per table (Prefect 3.7-3.9's schema).
COLUMNS = {
    "task_run_state": {"id", "type", "task_run_id", "state_details"},
    "task_run": {"id", "flow_run_id", "state_type"},
}
SUPERSEDED = "('PENDING', 'RUNNING')"  # a completed task run's own state is its Completed one, never these
COMPLETED = "SELECT id FROM task_run WHERE flow_run_id = ? AND state_type = 'COMPLETED'"
BUSY_TIMEOUT_S = 10.0  # SQLite: wait this long for the server's own writes
TASK_HISTORY_ENV = "PPO_TASK_HISTORY"  # `full` keeps every state; `compact` (the default) compacts


class HistoryCompactionUnavailable(RuntimeError):
    """This database cannot be compacted here; the message says why, never the URL's password."""


@dataclass(frozen=True)
class PrefectDatabase:
    """The database a Prefect server keeps its history in, as its connection URL."""

    url: str

    @property
    def dialect(self) -> str:
        return "postgresql" if urlsplit(self.url).scheme.startswith("postgresql") else "sqlite"

    @classmethod
    def of_settings(cls) -> "PrefectDatabase":
        """The database Prefect's current settings name (a server's, or this process's
        default SQLite under PREFECT_HOME)."""
        from prefect.settings import get_current_settings

        url = get_current_settings().server.database.connection_url
        return cls(url.get_secret_value() if url is not None else "")

    def here(self) -> bool:
        """Whether this process can reach the database: a PostgreSQL URL, or a SQLite
        file that exists (one under this process's own PREFECT_HOME may not be the
        served API's)."""
        path = self.sqlite_path()
        return self.dialect == "postgresql" or (path is not None and path.is_file())

    def sqlite_path(self) -> Path | None:
        if self.dialect != "sqlite":
            return None
        path = self.url.split(":///", 1)[1] if ":///" in self.url else ""
        return Path(path) if path and path != ":memory:" else None


def compaction_wanted(environ: Mapping[str, str]) -> bool:
    """Unless the operator keeps every state (`PPO_TASK_HISTORY=full`), on a Prefect
    this was written for."""
    if environ.get(TASK_HISTORY_ENV, "compact") == "full":
        return False
    return within("prefect", WRITTEN_FOR, "compacting finished task runs' states", "every state is kept")


def compact_flow_run(database: PrefectDatabase, flow_run_id: uuid.UUID) -> int:
    """Deletes the superseded states of `flow_run_id`'s completed task runs; returns how
    many. Raises HistoryCompactionUnavailable when the database is not there (a SQLite
    file is never created) or its schema is not the one this was written for."""
    if not database.here():
        raise HistoryCompactionUnavailable(f"no Prefect database file at {database.sqlite_path()}")
    if database.dialect == "sqlite":
        return _compact_sqlite(database.sqlite_path(), str(flow_run_id))
    return asyncio.run(_compact_postgresql(database.url, flow_run_id))


def _compact_sqlite(path: Path, flow_run_id: str) -> int:
    """SQLite appends rows and reuses a page only once it is empty, so deleting two rows
    of every three would leave each page a third full and save little: the kept states
    are moved instead (deleted with the others, then inserted again at the table's end,
    their details without the keys that only repeat a default), which empties the old
    pages for the rows that come next. One transaction: a reader sees before or after."""
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        present = {table: {row[1] for row in connection.execute(f"PRAGMA table_info({table})")} for table in COLUMNS}
        _check_columns(present)
        connection.execute("BEGIN IMMEDIATE")
        try:
            superseded = connection.execute(
                f"SELECT count(*) FROM task_run_state WHERE type IN {SUPERSEDED} AND task_run_id IN ({COMPLETED})",
                (flow_run_id,),
            ).fetchone()[0]
            if superseded:
                cursor = connection.execute(
                    f"SELECT * FROM task_run_state WHERE type NOT IN {SUPERSEDED} AND task_run_id IN ({COMPLETED})",
                    (flow_run_id,),
                )
                names = [column[0] for column in cursor.description]
                kept = [_without_defaults(dict(zip(names, row))) for row in cursor.fetchall()]
                connection.execute(f"DELETE FROM task_run_state WHERE task_run_id IN ({COMPLETED})", (flow_run_id,))
                connection.executemany(
                    f"INSERT INTO task_run_state ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                    [tuple(row[name] for name in names) for row in kept],
                )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        return superseded
    finally:
        connection.close()


def _without_defaults(row: dict[str, Any]) -> dict[str, Any]:
    """A state's details hold every field, most of them null or false: Prefect reads a
    missing one as exactly that default."""
    try:
        details = json.loads(row.get("state_details") or "{}")
    except ValueError:
        return row
    if isinstance(details, dict):
        row["state_details"] = json.dumps({key: value for key, value in details.items() if value not in (None, False)})
    return row


async def _compact_postgresql(url: str, flow_run_id: uuid.UUID) -> int:
    """PostgreSQL reuses a deleted row's space in its page (after its autovacuum), so a
    plain delete is enough."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            present = await connection.run_sync(_columns_present)
            _check_columns(present)
            result = await connection.execute(
                text(f"DELETE FROM task_run_state WHERE type IN {SUPERSEDED} AND task_run_id IN "
                     f"({COMPLETED.replace('?', ':flow_run')})"),
                {"flow_run": flow_run_id},
            )
            return int(result.rowcount or 0)
    finally:
        await engine.dispose()


def _columns_present(connection: Any) -> dict[str, set[str]]:
    from sqlalchemy import inspect

    inspector = inspect(connection)
    return {table: {column["name"] for column in inspector.get_columns(table)} if inspector.has_table(table) else set()
            for table in COLUMNS}


def _check_columns(present: dict[str, set[str]]) -> None:
    missing = []
    for table, wanted in COLUMNS.items():
        if not present.get(table):
            missing.append(table)
        else:
            missing.extend(f"{table}.{name}" for name in sorted(wanted - present[table]))
    if missing:
        raise HistoryCompactionUnavailable(
            f"the Prefect database's schema lacks {', '.join(missing)} (written for Prefect{WRITTEN_FOR})"
        )
