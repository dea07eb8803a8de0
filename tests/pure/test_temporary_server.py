"""The temporary API's retry of requests that met a locked SQLite database
(processes/temporary_server.py): retried in the server, body and all, only for that 503,
and never for ever. The 503 is the one Prefect's own exception handler sends for a
locked database (asked of the installed Prefect, S-DEP-2), not a copy of it."""

from __future__ import annotations

import asyncio
import json

from compat.prefect_compat import locked_database_body
from processes.temporary_server import RetryLockedDatabase

LOCKED_BODY = locked_database_body()


def _json_app(outcomes: list[tuple[int, dict]], seen: list[bytes]):
    """An ASGI app answering each call with the next (status, JSON body), recording the
    request body it was given. Like Prefect's app under Starlette's error middleware,
    it raises after sending a 5xx: the handled error goes on to the server's log."""

    async def app(scope, receive, send):
        assert scope["path"] == "/api/task_runs/" and "route" not in scope  # as the client sent it
        scope["path"], scope["route"] = "/task_runs/", "create_task_run"  # as a mounted router rewrites it
        message = await receive()
        seen.append(message["body"])
        status, payload = outcomes.pop(0)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(payload).encode()})
        if status >= 500:
            raise RuntimeError("database is locked")

    return app


def _call(app, body_parts: list[bytes]) -> list[dict]:
    sent: list[dict] = []
    parts = list(body_parts)

    async def receive():
        if parts:
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts)}
        await asyncio.sleep(3600)  # the client stays connected

    async def send(message):
        sent.append(message)

    try:
        asyncio.run(app({"type": "http", "method": "POST", "path": "/api/task_runs/"}, receive, send))
    except RuntimeError:  # the app's own re-raise of an error it answered (as uvicorn logs it)
        assert sent and sent[0]["status"] >= 500
    return sent


def test_a_locked_database_503_is_retried_in_the_server_with_the_same_body():
    seen: list[bytes] = []
    outcomes = [(503, LOCKED_BODY), (503, LOCKED_BODY), (201, {"id": "x"})]
    app = RetryLockedDatabase(_json_app(outcomes, seen), LOCKED_BODY, pause_s=0)
    sent = _call(app, [b'{"name": ', b'"rollout"}'])
    assert seen == [b'{"name": "rollout"}'] * 3  # replayed whole on every attempt
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [201]
    assert json.loads(sent[-1]["body"]) == {"id": "x"}


def test_any_other_503_goes_out_at_once():
    seen: list[bytes] = []
    unavailable = [(503, {"message": "Database is not available"})]
    app = RetryLockedDatabase(_json_app(unavailable, seen), LOCKED_BODY, pause_s=0)
    sent = _call(app, [b""])
    assert len(seen) == 1
    assert sent[0]["status"] == 503 and json.loads(sent[1]["body"]) == {"message": "Database is not available"}


def test_after_its_attempts_the_503_reaches_the_client_whose_own_back_off_applies():
    seen: list[bytes] = []
    app = RetryLockedDatabase(_json_app([(503, LOCKED_BODY)] * 4, seen), LOCKED_BODY, attempts=4, pause_s=0)
    sent = _call(app, [b"{}"])
    assert len(seen) == 4
    assert sent[0]["status"] == 503 and json.loads(sent[1]["body"]) == LOCKED_BODY


def test_a_request_that_met_a_really_locked_database_is_retried_through_prefects_own_handler(tmp_path):
    """A real SQLite database, locked by another connection, answered by Prefect's own
    exception handler (as registered on its app) and retried until the lock is gone."""
    import sqlite3

    import httpx
    import sqlalchemy
    from prefect.server.api.server import custom_internal_exception_handler
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    database = tmp_path / "locked.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{database}", connect_args={"timeout": 0})
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("CREATE TABLE runs (name TEXT)"))
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    attempts = []

    async def insert(request):
        attempts.append(await request.body())
        if len(attempts) == 3:
            holder.execute("COMMIT")  # the other writer is done
        with engine.begin() as connection:  # raises sqlalchemy's OperationalError: database is locked
            connection.execute(sqlalchemy.text("INSERT INTO runs VALUES (:name)"), {"name": "rollout"})
        return JSONResponse({"inserted": True}, status_code=201)

    prefect_like = Starlette(routes=[Route("/runs", insert, methods=["POST"])],
                             exception_handlers={Exception: custom_internal_exception_handler})

    async def post(app) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.post("/runs", content=b'{"name": "rollout"}')

    response = asyncio.run(post(RetryLockedDatabase(prefect_like, LOCKED_BODY, pause_s=0.01)))
    assert response.status_code == 201 and response.json() == {"inserted": True}
    assert attempts == [b'{"name": "rollout"}'] * 3
    with engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT count(*) FROM runs")).scalar() == 1
    # Without the retry, the client gets Prefect's 503 and its own fixed back-off.
    holder.execute("BEGIN EXCLUSIVE")
    attempts.clear()
    refused = asyncio.run(post(prefect_like))
    assert refused.status_code == 503 and refused.json() == LOCKED_BODY
    holder.execute("COMMIT")
