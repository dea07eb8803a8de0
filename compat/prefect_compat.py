"""Prefect's internals, used only on the Prefect versions they were written against.

Three things need them: the command line's own temporary API (Prefect's server app
behind the retry of processes/temporary_server.py, with a smaller SQLite page cache than
Prefect's, the private settings Prefect gives its own temporary server, and a read of
Prefect's settings files before Prefect is imported; docs/architecture.md), creating an
artifact synchronously from a thread Prefect might take for async, draining the log and
event workers when a command ends, and keeping the engine's error record of a cleanly
stopped run out of its logs. Outside `WRITTEN_FOR` the run lets Prefect start its own
temporary server, artifacts are created through the plain public `.create()`, the logs
are flushed through the public `APILogHandler.flush()` (events then go with Prefect's
exit handlers), and that error record stays.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from compat.versions import within

WRITTEN_FOR = SpecifierSet(">=3.7,<3.10")


# What Prefect's SubprocessASGIServer gives its temporary server beside the settings: no
# UI, and Prefect's private ephemeral-mode switches. Launched only when
# `temporary_api_supported()`.
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
# Settings that decide whether a run has a standing API (or may start a temporary one).
DECIDING_ENV = ("PREFECT_API_URL", "PREFECT_SERVER_EPHEMERAL_ENABLED", "PREFECT_API_SERVICES_EPHEMERAL_ENABLED")


def temporary_api_supported() -> bool:
    return within("prefect", WRITTEN_FOR, "the command line's own temporary API", "Prefect starts its own server")


def standing_api_possible(environ: "os._Environ[str] | dict[str, str]", cwd: Path) -> bool:
    """False only when no setting that could name an API (or turn temporary ones off)
    is in the environment, the active profiles file, or a settings file Prefect reads
    from the working directory: a plain read of their text, where Prefect's settings
    sources look for them, without importing Prefect (it is slow to import). True may
    be wrong (Prefect then decides, as it always does outside `WRITTEN_FOR`); False is
    right for every source it names."""
    if not temporary_api_supported() or any(environ.get(key) for key in DECIDING_ENV):
        return True
    home = Path(os.path.expanduser(environ.get("PREFECT_HOME") or "~/.prefect"))
    profiles = Path(os.path.expanduser(environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml"))
    sources = [(profiles, ("API_URL", "EPHEMERAL")), (cwd / ".env", ("PREFECT_",)),
               (cwd / "prefect.toml", ("",)), (cwd / "pyproject.toml", ("tool.prefect",))]
    for path, markers in sources:
        try:
            text = path.read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue
        except OSError:
            return True
        if any(marker in text for marker in markers):
            return True
    return False


def server_app() -> Any:
    """Prefect's own API server app, as its `prefect server start` and its temporary
    server serve it."""
    from prefect.server.api.server import create_app

    return create_app()


# Prefect gives each pooled SQLite connection a 20,000-page cache (80 MiB); the temporary
# API pools several, so its memory grew with the run's database until each was full.
SQLITE_PAGE_CACHE_KIB = 8192


def cap_sqlite_page_cache() -> None:
    """Every SQLite connection this process checks out of a SQLAlchemy pool gets a page
    cache of `SQLITE_PAGE_CACHE_KIB`: set at each checkout because Prefect sets its own
    when it connects, after any listener registered earlier would run. PostgreSQL
    connections are left alone."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    if not event.contains(Pool, "checkout", sqlite_page_cache_at_checkout):
        event.listen(Pool, "checkout", sqlite_page_cache_at_checkout)


def sqlite_page_cache_at_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    if "sqlite" not in type(dbapi_connection).__module__:
        return
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA cache_size = -{SQLITE_PAGE_CACHE_KIB}")
    finally:
        cursor.close()


# SQLAlchemy writes a tuple IN for SQLite as `(a, b, c) IN (VALUES (...), ...)`, which
# SQLite answers by reading the whole table; the same rows read through a subquery use
# the table's index. Prefect 3.9's task-run recorder looks its task runs up this way at
# every flush, so the temporary API's CPU per iteration grew with the run's task runs.
TUPLE_IN_VALUES = " IN (VALUES "


def index_tuple_lookups_on_sqlite() -> None:
    """Every SQLite statement this process runs through SQLAlchemy has its tuple IN
    lists read through a subquery (`rewrite_tuple_in`). PostgreSQL's are left alone."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "before_cursor_execute", tuple_in_through_subquery):
        event.listen(Engine, "before_cursor_execute", tuple_in_through_subquery, retval=True)


def tuple_in_through_subquery(
    connection: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
) -> tuple[str, Any]:
    if TUPLE_IN_VALUES in statement and connection.dialect.name == "sqlite":
        statement = rewrite_tuple_in(statement)
    return statement, parameters


def rewrite_tuple_in(statement: str) -> str:
    """Each `IN (VALUES rows)` of `statement` as `IN (SELECT * FROM (VALUES rows))`: the
    same rows, the same bound parameters in the same order."""
    parts, start = [], 0
    while (found := statement.find(TUPLE_IN_VALUES, start)) >= 0:
        opened = found + len(" IN ")
        closed = _closing_parenthesis(statement, opened)
        if closed < 0:  # not a statement this can read: leave the rest as it is
            break
        parts += [statement[start:opened], "(SELECT * FROM ", statement[opened:closed + 1], ")"]
        start = closed + 1
    return "".join(parts) + statement[start:]


def _closing_parenthesis(text: str, opened: int) -> int:
    """Where the parenthesis at `opened` closes (quoted text skipped), or -1."""
    depth, quote = 0, ""
    for at in range(opened, len(text)):
        char = text[at]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return at
    return -1


def locked_database_body() -> Any:
    """The JSON body of the 503 that Prefect's own exception handler answers to a
    request that met a locked SQLite database: asked of the handler, so the retry
    keys on whatever the installed Prefect sends."""
    import sqlite3

    import sqlalchemy.exc
    from prefect.server.api.server import custom_internal_exception_handler

    locked = sqlalchemy.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    with ThreadPoolExecutor(1) as thread:  # uvicorn calls the app factory inside its own event loop
        response = thread.submit(asyncio.run, custom_internal_exception_handler(None, locked)).result()
    if response.status_code != 503:
        raise RuntimeError(f"Prefect answers a locked database with {response.status_code}, not a retryable 503")
    return json.loads(bytes(response.body))


def create_artifact(artifact: Any) -> Any:
    """`artifact.create()`, run to completion whichever context calls it (a background
    thread with a copied Prefect context included): Prefect decides sync or async from
    that context, and its private `_sync` says which."""
    if within("prefect", WRITTEN_FOR, "creating an artifact synchronously", "the public create()"):
        return artifact.create(_sync=True)
    created = artifact.create()
    return asyncio.run(created) if inspect.isawaitable(created) else created


def drain_logs_and_events(timeout_s: float) -> None:
    """Send the logs and events Prefect has queued now, each worker given `timeout_s`
    (`drain_all` is the queue services' own, defined in `prefect._internal`). Outside
    `WRITTEN_FOR`: the public `APILogHandler.flush()` for the logs; the events are
    left to Prefect's exit handlers."""
    from prefect.logging.handlers import APILogHandler, APILogWorker

    if not within("prefect", WRITTEN_FOR, "draining the log and event workers", "APILogHandler.flush()"):
        APILogHandler().flush()
        return
    from prefect.events.worker import EventsWorker

    APILogWorker.drain_all(timeout=timeout_s)
    EventsWorker.drain_all(timeout=timeout_s)


ENGINE_ERROR = "Engine execution exited with unexpected exception"  # what Prefect's run_flow logs, 3.7-3.9


class _CancelledRunIsNoError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.exceptions import CancelledRun

        raised = record.exc_info[1] if record.exc_info else None
        return not (record.getMessage() == ENGINE_ERROR and isinstance(raised, CancelledRun))


COMPLETED_TASK_LINE = re.compile(r"Finished in state Completed\(.*\)", re.DOTALL)  # task_engine's, 3.7-3.9


class _CompletedTaskLineIsNoNews(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and COMPLETED_TASK_LINE.fullmatch(record.getMessage()))


def quiet_completed_task_lines() -> None:
    """Prefect's engine logs `Finished in state Completed()` for every task run: half of
    a training run's log rows (8 of 16 per tiny iteration), saying what the task run's
    state already shows in the UI. That line is dropped for completed task runs; a task
    run that ends in any other state keeps its line (an ERROR), and every log line of
    the run's own is kept (S-FOOT-1)."""
    logger = logging.getLogger("prefect.task_runs")
    if not any(isinstance(existing, _CompletedTaskLineIsNoNews) for existing in logger.filters):
        logger.addFilter(_CompletedTaskLineIsNoNews())


def quiet_cancelled_run_error() -> None:
    """A deployment's flow run that ends Cancelled by returning that state (a clean stop,
    S-STOP-4) makes Prefect's engine raise `CancelledRun` from the run's result, which it
    logs into the run's logs as an ERROR with a traceback, though the run did what it
    was asked. That record, for `CancelledRun` only, is dropped; every other is kept."""
    if not within("prefect", WRITTEN_FOR, "dropping the engine's error record of a stopped run", "it stays"):
        return
    logger = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(existing, _CancelledRunIsNoError) for existing in logger.filters):
        logger.addFilter(_CancelledRunIsNoError())
