"""Prefect's internals, used only on the Prefect versions they were written against.

Two things need them: the command line's own temporary API (Prefect's server app,
behind the retry of processes/temporary_server.py, docs/architecture.md) and creating an
artifact synchronously from a thread Prefect might take for async. Outside
`WRITTEN_FOR` the run lets Prefect start its own temporary server, and artifacts are
created through the plain public `.create()`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from packaging.specifiers import SpecifierSet

from compat.versions import within

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
