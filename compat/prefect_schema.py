"""Whether the installed Prefect can open a Prefect database: one written by a newer
Prefect (the CPU lock has 3.9, the GPU lock 3.7) makes Prefect's own server exit while
starting with nothing but an exit code. Read from the database's Alembic revision and
the migrations the installed Prefect ships, without importing Prefect (a file check
before a server starts)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sqlite3
from pathlib import Path

REVISION_LINE = re.compile(r'^revision\s*=\s*"([0-9a-f]+)"', re.MULTILINE)
# Where a fresh database comes from: a file under PREFECT_HOME, or another PostgreSQL database.
FRESH_DATABASE = {
    "sqlite": "another PREFECT_HOME, or PPO_PREFECT_STATE_DIR for make serve",
    "postgresql": "another database in PREFECT_SERVER_DATABASE_CONNECTION_URL, or another PPO_PREFECT_STATE_DIR "
    "for make serve PPO_PREFECT_DB=postgres",
}


def installed_revisions(dialect: str) -> set[str]:
    """The schema revisions the installed Prefect knows (`sqlite` or `postgresql`)."""
    spec = importlib.util.find_spec("prefect")
    root = Path(next(iter(spec.submodule_search_locations)))
    versions = root / "server" / "database" / "_migrations" / "versions" / dialect
    return {match for path in versions.glob("*.py") for match in REVISION_LINE.findall(path.read_text())}


def sqlite_revision(database: Path) -> str | None:
    """The revision a SQLite database was migrated to; None for a new or empty one."""
    if not database.exists():
        return None
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:  # no table yet, or not readable here: Prefect will say
        return None
    return row[0] if row else None


def newer_schema_problem(revision: str | None, dialect: str, database: str) -> str | None:
    """A message naming the cause and the way out when `revision` is one the installed
    Prefect does not know; None when it can open the database."""
    if revision is None or revision in installed_revisions(dialect):
        return None
    installed = importlib.metadata.version("prefect")
    fresh = FRESH_DATABASE[dialect]
    return (
        f"{database} was written by a newer Prefect than the installed {installed} (its schema revision "
        f"{revision} is unknown to it), which cannot open it: run the Prefect that wrote it (the CPU lock, "
        f"requirements.lock, has a newer Prefect than the GPU lock), or start on a fresh database ({fresh})"
    )


def sqlite_database_problem(prefect_home: Path) -> str | None:
    """The check for the SQLite database Prefect keeps under PREFECT_HOME."""
    database = prefect_home / "prefect.db"
    return newer_schema_problem(sqlite_revision(database), "sqlite", f"the Prefect database {database}")
