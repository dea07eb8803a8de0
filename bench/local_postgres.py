"""A throwaway PostgreSQL 15 cluster for a benchmark's own Prefect server.

`make serve PPO_PREFECT_DB=postgres` starts a cluster for a standing stack; a benchmark
that starts its own `prefect server` (bench/ui_scale.py) needs one it can remove
afterwards. Same shape as serve.sh's: loopback only, a generated password, scram over
TCP; as root its commands run as the `postgres` user, which PostgreSQL requires.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PG_BIN = Path(os.environ.get("PPO_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def throwaway_cluster(pg_bin: Path = PG_BIN) -> Iterator[str]:
    """Yields the asyncpg URL of a fresh `prefect` database; the cluster is stopped
    (pg_ctl, by its data directory) and its folder removed on exit."""
    if not (pg_bin / "initdb").exists():
        raise SystemExit(f"error: PostgreSQL 15 is not installed ({pg_bin}/initdb; apt-get install postgresql-15)")
    folder = Path(tempfile.mkdtemp(prefix="ppo-bench-pg-", dir="/tmp"))
    data, password, port = folder / "data", secrets.token_hex(24), _free_port()
    (folder / "password").write_text(password)
    (folder / "password").chmod(0o600)
    if os.geteuid() == 0:  # the cluster's user must own its folder
        for path in (folder, folder / "password"):
            shutil.chown(path, "postgres")
    started = False
    try:
        subprocess.run(_as_postgres([
            str(pg_bin / "initdb"), "-D", str(data), "-U", "prefect", f"--pwfile={folder / 'password'}", "-E", "UTF8",
            "--auth-host=scram-sha-256", "--auth-local=trust",
        ]), check=True, capture_output=True, timeout=300)
        subprocess.run(_as_postgres([
            str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(folder / "postgres.log"), "-w", "-t", "120",
            "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}", "start",
        ]), check=True, capture_output=True, timeout=180)
        started = True
        subprocess.run(_as_postgres([
            str(pg_bin / "createdb"), "-h", str(folder), "-p", str(port), "-U", "prefect", "prefect",
        ]), check=True, capture_output=True, timeout=60)
        yield f"postgresql+asyncpg://prefect:{password}@127.0.0.1:{port}/prefect"
    finally:
        if started:
            subprocess.run(_as_postgres([str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                           capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


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
