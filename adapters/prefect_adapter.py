"""Prefect's internals, used only on the Prefect versions they were written against.

Three things need them: the command line's own temporary API (Prefect's server app,
behind the retry of processes/temporary_server.py, docs/architecture.md), creating an
artifact synchronously from a thread Prefect might take for async, and keeping the
engine's error record of a cleanly stopped run out of its logs. Outside `WRITTEN_FOR`
the run lets Prefect start its own temporary server, artifacts are created through the
plain public `.create()`, and that record stays.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from packaging.specifiers import SpecifierSet

from adapters.versions import within

WRITTEN_FOR = SpecifierSet(">=3.7,<3.10")


def temporary_api_supported() -> bool:
    return within("prefect", WRITTEN_FOR, "the command line's own temporary API", "Prefect starts its own server")


def server_app() -> Any:
    """Prefect's own API server app, as its `prefect server start` and its temporary
    server serve it."""
    from prefect.server.api.server import create_app

    return create_app()


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


ENGINE_ERROR = "Engine execution exited with unexpected exception"  # what Prefect's run_flow logs, 3.7-3.9


class _CancelledRunIsNoError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.exceptions import CancelledRun

        raised = record.exc_info[1] if record.exc_info else None
        return not (record.getMessage() == ENGINE_ERROR and isinstance(raised, CancelledRun))


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
