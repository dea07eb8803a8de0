"""The temporary API's retry of requests that met a locked SQLite database
(flows/temporary_server.py): retried in the server, body and all, only for that 503,
and never for ever. The 503 is the one Prefect's own exception handler sends for a
locked database (asked of the installed Prefect, S-DEP-2), not a copy of it."""

from __future__ import annotations

import asyncio
import json

from adapters.prefect_adapter import locked_database_body
from flows.temporary_server import RetryLockedDatabase

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
