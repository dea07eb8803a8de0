"""The Prefect server's database, checked by `make serve` before it starts a server on
it (S-TEAM-1): a PostgreSQL that is down or refuses the password fails the launch
within a timeout, naming the host and port and never the password, instead of a
server that dies (or retries) with the connection string in its log.

    python -m deployments.database check    # reads PREFECT_SERVER_DATABASE_CONNECTION_URL

Without a URL it checks the SQLite database under PREFECT_HOME. Either way, a database
written by a newer Prefect than the installed one is named as such (Prefect's own server
only exits). Exit status 0 when the database can be served, 1 with one line on stderr
otherwise."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

from compat.prefect_schema import newer_schema_problem, sqlite_database_problem

URL_SETTINGS = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")  # new, legacy


class DatabaseUnavailable(RuntimeError):
    pass


def connection_url(environ: Mapping[str, str]) -> str | None:
    return next((environ[name] for name in URL_SETTINGS if environ.get(name)), None)


def where(url: str) -> str:
    """`host:port` of a database URL, the only part of it a message may show."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"


def check(url: str, timeout_s: float) -> None:
    """Connects once, as the server will (asyncpg), within `timeout_s`; raises
    DatabaseUnavailable naming host, port, user and database, never the password."""
    parts = urlsplit(url)
    if not parts.scheme.startswith("postgresql"):
        return  # SQLite: a file the server creates
    import asyncpg

    user, database = unquote(parts.username or ""), parts.path.lstrip("/") or None
    place = f"the Prefect database {database!r} at {where(url)}"

    async def connect() -> str | None:
        connection = await asyncpg.connect(
            host=parts.hostname, port=parts.port or 5432, user=user or None,
            password=unquote(parts.password) if parts.password else None, database=database, timeout=timeout_s,
        )
        try:
            return await connection.fetchval("SELECT version_num FROM alembic_version")
        except asyncpg.UndefinedTableError:  # a new database: Prefect creates its tables
            return None
        finally:
            await connection.close()

    try:
        revision = asyncio.run(asyncio.wait_for(connect(), timeout_s))
    except asyncpg.InvalidPasswordError:
        raise DatabaseUnavailable(f"{place} refused the password of user {user!r}") from None
    except asyncpg.InvalidCatalogNameError:
        raise DatabaseUnavailable(f"{place} does not exist (create it: CREATE DATABASE ...)") from None
    except (OSError, asyncio.TimeoutError) as error:
        reason = "no answer" if isinstance(error, asyncio.TimeoutError) else type(error).__name__
        raise DatabaseUnavailable(f"{place} is not reachable within {timeout_s:g} s ({reason})") from None
    except Exception as error:  # noqa: BLE001  (any other refusal: named by its type, never by a message with the URL)
        raise DatabaseUnavailable(f"{place} refused the connection ({type(error).__name__})") from None
    problem = newer_schema_problem(revision, "postgresql", place)
    if problem:
        raise DatabaseUnavailable(problem)


def main(argv: list[str]) -> int:
    if argv != ["check"]:
        print("usage: python -m deployments.database check", file=sys.stderr)
        return 2
    url = connection_url(os.environ)
    timeout_s = float(os.environ.get("PPO_PREFECT_DB_TIMEOUT", "20"))
    try:
        if url is None:
            problem = sqlite_database_problem(Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser())
            if problem:
                raise DatabaseUnavailable(problem)
        else:
            check(url, timeout_s)
    except DatabaseUnavailable as error:
        print(f"serve: {error}; start it, or correct PREFECT_SERVER_DATABASE_CONNECTION_URL", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
