"""The app the temporary Prefect API serves: Prefect's own, with a request that hit a
locked SQLite database retried in the server after a short pause instead of after the
client's fixed back-off. Only Prefect's own "database is locked" 503 is retried: the
request's transaction was rolled back, so running it again is what the client would do.
Its SQLite connections keep a smaller page cache than Prefect's, and its task-run
lookups use their index (S-FOOT-1), so the API's memory and CPU per iteration stay flat
while a long run's database grows.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

ATTEMPTS = 20
PAUSE_S = 0.05


class RetryLockedDatabase:
    """ASGI middleware: an HTTP request answered with a 503 whose JSON body is
    `locked_body` is run again, with its body replayed, up to `attempts` times,
    `pause_s` apart."""

    def __init__(self, app: App, locked_body: Any, attempts: int = ATTEMPTS, pause_s: float = PAUSE_S) -> None:
        self.app = app
        self.locked_body = locked_body
        self.attempts = attempts
        self.pause_s = pause_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        if more is not None:  # the client went away while sending: nothing to retry
            await self.app(scope, _replay(body, more, receive), send)
            return
        pristine = dict(scope)  # routing rewrites the scope it is given (path, root_path, route)
        for attempt in range(1, self.attempts + 1):
            scope = dict(pristine)
            last = attempt == self.attempts
            held: list[Message] = []

            async def forward(message: Message, held: list[Message] = held, last: bool = last) -> None:
                if message["type"] == "http.response.start" and message["status"] == 503 and not last:
                    held.append(message)
                elif held:
                    held.append(message)
                else:
                    await send(message)

            try:
                await self.app(scope, _replay(body, None, receive), forward)
            except Exception:
                # Starlette's error middleware re-raises once it has sent the error
                # response (for the server's log): with that response held here, it is
                # the answer to look at; with nothing held, the client has its answer.
                if not held:
                    raise
            if not held:
                return
            if not _is_locked(held, self.locked_body):  # another 503: as the app sent it
                for message in held:
                    await send(message)
                return
            await asyncio.sleep(self.pause_s)


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The whole request body, and the message that ended it early (a disconnect), if any."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, ending: Message | None, receive: Receive) -> Receive:
    """`receive` for one run of the app: the buffered body, then the real channel (a
    disconnect, when the client goes)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if ending is not None:
            return ending
        return await receive()

    return replay


def _is_locked(held: list[Message], locked_body: Any) -> bool:
    body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
    try:
        return json.loads(body) == locked_body
    except ValueError:
        return False


def create_app() -> App:
    """The uvicorn factory of the temporary API (processes/temporary_api.py)."""
    from compat.prefect_compat import (
        cap_sqlite_page_cache, index_tuple_lookups_on_sqlite, locked_database_body, server_app,
    )

    cap_sqlite_page_cache()
    index_tuple_lookups_on_sqlite()
    return RetryLockedDatabase(server_app(), locked_body=locked_database_body())
