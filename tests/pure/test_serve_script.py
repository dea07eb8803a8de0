"""`make serve` keeps Prefect on loopback unless the server requires its auth string
(issue 16 item 8, S-SEC-1).

deployments/serve.sh runs here with PPO_PYTHON pointing at a stub that records each
call and starts nothing, so these tests never start a server: a refusal must come
before the stub is called at all, and an accepted setting reaches it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SERVE = Path(__file__).resolve().parents[2] / "deployments" / "serve.sh"

# Answers `-m cli.environment --export-tuning` with nothing and passes the database check;
# fails any other call (the port check), so serve.sh stops with "port ... in use" before
# starting anything.
STUB = """#!/usr/bin/env bash
echo "$*" >> "{calls}"
[[ "$2" == cli.environment || "$2" == deployments.database ]] && exit 0
exit 1
"""


def serve(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    calls = tmp_path / "calls.log"
    stub = tmp_path / "python"
    stub.write_text(STUB.format(calls=calls))
    stub.chmod(0o755)
    state = tmp_path / "state"
    base = {key: value for key, value in os.environ.items() if not key.startswith(("PPO_", "PREFECT_"))}
    result = subprocess.run(
        ["bash", str(SERVE)], env={**base, "PPO_PYTHON": str(stub), "PPO_PREFECT_STATE_DIR": str(state), **env},
        capture_output=True, text=True, timeout=60,
    )
    return result, calls.read_text().splitlines() if calls.exists() else [], state


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "127.evil.example", "ppo-node-1"])
def test_a_non_loopback_host_without_the_auth_string_is_refused_before_anything_starts(tmp_path, host):
    result, calls, state = serve(tmp_path, PPO_PREFECT_HOST=host)
    assert result.returncode == 2, result.stderr
    assert f"PPO_PREFECT_HOST={host} is not a loopback address" in result.stderr
    assert "PREFECT_SERVER_API_AUTH_STRING" in result.stderr
    assert calls == [] and not state.exists()  # no Python, no state directory, no server


def test_an_auth_string_must_be_user_colon_password(tmp_path):
    result, calls, state = serve(tmp_path, PPO_PREFECT_HOST="0.0.0.0", PREFECT_SERVER_API_AUTH_STRING="secret")
    assert result.returncode == 2 and "user:password" in result.stderr
    assert calls == [] and not state.exists()


@pytest.mark.parametrize("host", [None, "127.0.0.1", "localhost", "::1"])
def test_loopback_hosts_need_no_auth_string(tmp_path, host):
    result, calls, _ = serve(tmp_path, **({"PPO_PREFECT_HOST": host} if host else {}))
    assert "not a loopback address" not in result.stderr
    assert calls and calls[0].endswith("cli.environment --export-tuning")  # went on to its own checks
    assert f"port 4200 on {host or '127.0.0.1'} is in use" in result.stderr  # the stub's answer, not a server


def test_with_the_auth_string_the_worker_and_cli_authenticate_and_the_secret_stays_off_disk(tmp_path):
    secret = "ppo:s3cret-value"
    result, calls, state = serve(tmp_path, PPO_PREFECT_HOST="0.0.0.0", PREFECT_SERVER_API_AUTH_STRING=secret)
    assert "not a loopback address" not in result.stderr and calls, result.stderr
    env_sh = (state / "env.sh").read_text()
    assert secret not in env_sh
    assert 'PREFECT_API_URL="http://127.0.0.1:4200/api"' in env_sh  # a wildcard bind is reached on loopback
    sourced = subprocess.run(
        ["bash", "-c", f"source {state / 'env.sh'} && echo \"$PREFECT_API_AUTH_STRING\""],
        env={"PATH": os.environ["PATH"], "PREFECT_SERVER_API_AUTH_STRING": secret},
        capture_output=True, text=True, check=True,
    )
    assert sourced.stdout.strip() == secret


def _real_serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """serve.sh with the project's Python, up to the database check (S-TEAM-1): the
    cases below all stop before a server could start."""
    import sys

    base = {key: value for key, value in os.environ.items() if not key.startswith(("PPO_", "PREFECT_"))}
    return subprocess.run(
        ["bash", str(SERVE)], env={**base, "PPO_PYTHON": sys.executable, "PPO_PREFECT_STATE_DIR": str(tmp_path / "s"),
                                   **env},
        capture_output=True, text=True, timeout=120,
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe closes


def test_a_database_that_is_down_fails_serve_naming_host_and_port_never_the_password(tmp_path):
    import time

    port = _closed_port()
    password = "hunter2-S3cret"
    started = time.monotonic()
    result = _real_serve(
        tmp_path, PPO_PREFECT_DB_TIMEOUT="5",
        PREFECT_SERVER_DATABASE_CONNECTION_URL=f"postgresql+asyncpg://prefect:{password}@127.0.0.1:{port}/prefect",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the Prefect database 'prefect' at 127.0.0.1:{port} is not reachable within 5 s" in result.stderr
    assert password not in result.stdout + result.stderr
    assert not (tmp_path / "s" / "server.pid").exists()  # nothing started
    assert time.monotonic() - started < 30
    for path in (tmp_path / "s").rglob("*"):
        assert path.is_dir() or password not in path.read_text(errors="replace"), path


@pytest.mark.parametrize(
    "env, message",
    [
        ({"PPO_PREFECT_DB": "mysql"}, "PPO_PREFECT_DB=mysql: choose sqlite (the default) or postgres"),
        ({"PPO_PREFECT_DB": "postgres", "PREFECT_SERVER_DATABASE_CONNECTION_URL": "postgresql+asyncpg://h/db"},
         "set one of them"),
        ({"PPO_PREFECT_DB": "postgres", "PPO_PG_BIN": "/nonexistent"}, "needs PostgreSQL 15"),
    ],
)
def test_a_database_setting_that_cannot_work_is_refused_before_anything_starts(tmp_path, env, message):
    result = _real_serve(tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "s" / "server.pid").exists()


def _database_of_a_newer_prefect(path: Path) -> None:
    import sqlite3

    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        connection.execute("INSERT INTO alembic_version VALUES ('fedcba987654')")  # no Prefect release has it


def test_a_database_written_by_a_newer_prefect_is_named_before_serve_starts_a_server(tmp_path):
    _database_of_a_newer_prefect(tmp_path / "s" / "home" / "prefect.db")
    result = _real_serve(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "was written by a newer Prefect than the installed" in result.stderr
    assert "schema revision fedcba987654" in result.stderr and "fresh database" in result.stderr
    assert not (tmp_path / "s" / "server.pid").exists()


def test_a_postgresql_database_written_by_a_newer_prefect_is_named_by_host_and_port(monkeypatch):
    """The PostgreSQL side of the check make serve runs first: the revision read from the
    database (here from a stand-in for asyncpg's connection) is one this Prefect lacks."""
    import asyncpg

    from deployments.database import DatabaseUnavailable, check

    class Connection:
        async def fetchval(self, query: str) -> str:
            assert query == "SELECT version_num FROM alembic_version"
            return "fedcba987654"  # no Prefect release has it

        async def close(self) -> None:
            pass

    async def connect(**kwargs) -> Connection:
        assert kwargs["host"] == "db.example" and kwargs["password"] == "s3cret"
        return Connection()

    monkeypatch.setattr(asyncpg, "connect", connect)
    with pytest.raises(DatabaseUnavailable) as raised:
        check("postgresql+asyncpg://prefect:s3cret@db.example:6543/prefect", timeout_s=5)
    message = str(raised.value)
    assert message.startswith("the Prefect database 'prefect' at db.example:6543 was written by a newer Prefect")
    assert "another database in PREFECT_SERVER_DATABASE_CONNECTION_URL" in message and "s3cret" not in message


def test_the_temporary_api_names_a_database_written_by_a_newer_prefect(tmp_path):
    import sys

    from processes.temporary_api import TemporaryApi, TemporaryApiFailed, free_loopback_port

    _database_of_a_newer_prefect(tmp_path / "prefect.db")
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])  # as Prefect's server exits on it
    exited.wait()
    api = TemporaryApi(exited, free_loopback_port(), [sys.executable], {"PREFECT_HOME": str(tmp_path)})
    with pytest.raises(TemporaryApiFailed, match=r"exited with code 3 while starting: the Prefect database .* "
                                                 r"was written by a newer Prefect"):
        api.wait_until_up(timeout_s=5)


def test_the_temporary_api_names_a_postgresql_that_is_down_by_host_and_port_never_the_password(tmp_path):
    """A command-line run whose settings name a team's PostgreSQL (S-TEAM-1): the server
    exits, and the line says which database and why, not only the exit code."""
    import sys

    from processes.temporary_api import TemporaryApi, TemporaryApiFailed, free_loopback_port

    closed = free_loopback_port()  # nothing listens there
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait()
    env = {"PREFECT_SERVER_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://prefect:s3cret@127.0.0.1:{closed}/prefect"}
    api = TemporaryApi(exited, free_loopback_port(), [sys.executable], env)
    with pytest.raises(TemporaryApiFailed) as raised:
        api.wait_until_up(timeout_s=5)
    message = str(raised.value)
    assert f"the Prefect database 'prefect' at 127.0.0.1:{closed} is not reachable" in message
    assert "PREFECT_SERVER_DATABASE_CONNECTION_URL" in message and "s3cret" not in message


def test_the_local_postgresql_starts_answers_on_loopback_only_and_stops(tmp_path):
    """S-TEAM-1: the one module that starts a local PostgreSQL, for `make serve
    PPO_PREFECT_DB=postgres` and the benchmarks alike: started, checked, its URL on stdout
    (the password nowhere else), found running the second time, stopped by stop.sh's call."""
    import sys

    from deployments.local_postgres import PG_BIN

    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL 15 is not installed ({PG_BIN}; .ci/run installs postgresql-15)")
    folder = Path("/tmp") / f"ppo-test-pg-{os.getpid()}"  # the `postgres` user must reach it: not under /root

    def local_postgres(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "deployments.local_postgres", *args, str(folder)],
                              cwd=SERVE.parents[1], capture_output=True, text=True, timeout=300)

    try:
        started = local_postgres("start")
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        password = (folder / "password").read_text().strip()
        assert url.startswith("postgresql+asyncpg://prefect:") and url.endswith("/prefect") and password in url
        assert "serve: started PostgreSQL on 127.0.0.1:" in started.stderr and password not in started.stderr
        assert oct((folder / "password").stat().st_mode & 0o777) == "0o600"
        again = local_postgres("start")
        assert again.returncode == 0 and again.stdout.strip() == url
        assert "already running" in again.stderr
        listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
        port = url.rsplit(":", 1)[1].split("/")[0]
        assert [line.split()[3] for line in listening.splitlines() if line.split()[3].endswith(f":{port}")] == [
            f"127.0.0.1:{port}"
        ]
        stopped = local_postgres("stop")
        assert stopped.returncode == 0 and stopped.stdout.strip() == "stop: postgres stopped", stopped.stderr
    finally:
        local_postgres("stop")
        subprocess.run(["rm", "-rf", str(folder)])
