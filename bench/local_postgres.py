"""Statements a benchmark runs on its throwaway PostgreSQL cluster
(deployments/local_postgres.py starts it, as it starts `make serve`'s)."""

from __future__ import annotations


def execute(database_url: str, *statements: str) -> None:
    """Runs `statements` on the cluster as the URL's user (the cluster's superuser for
    a throwaway one): `ANALYZE`, or a setting changed and reloaded."""
    import asyncio
    from urllib.parse import unquote, urlsplit

    import asyncpg

    parts = urlsplit(database_url)

    async def run() -> None:
        connection = await asyncpg.connect(
            host=parts.hostname, port=parts.port, user=parts.username, password=unquote(parts.password or ""),
            database=parts.path.lstrip("/"),
        )
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run())
