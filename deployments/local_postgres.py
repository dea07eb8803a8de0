"""A local PostgreSQL 15 cluster for a Prefect server: the standing one `make serve
PPO_PREFECT_DB=postgres` keeps under its state directory, and the throwaway one a
benchmark or the GPU lock's proof starts and removes. One shape for both: loopback only,
a generated password in a 0600 file, scram over TCP, the socket in a folder only the
cluster's user can enter. PostgreSQL refuses to run as root, so as root its commands run
as the `postgres` user.

    python -m deployments.local_postgres start FOLDER [--timeout S]   # prints the database URL
    python -m deployments.local_postgres stop FOLDER
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PG_BIN = Path(os.environ.get("PPO_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "prefect"  # the cluster's superuser, and the owner of the `prefect` database


class PostgresFailed(RuntimeError):
    """The cluster could not be made, started or stopped; the message names its log."""


class PostgresMissing(PostgresFailed):
    """PostgreSQL 15's programs are not where PPO_PG_BIN says."""


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class LocalPostgres:
    """The cluster kept in `folder`: data/, password, port and the logs."""

    folder: Path
    pg_bin: Path = PG_BIN

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def port(self) -> int:
        return int((self.folder / "port").read_text())

    def url(self, database: str = "prefect") -> str:
        password = (self.folder / "password").read_text().strip()
        return f"postgresql+asyncpg://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *arguments: str, timeout_s: float) -> subprocess.CompletedProcess:
        return subprocess.run(_as_postgres([str(self.pg_bin / program), *arguments]), capture_output=True, text=True,
                              timeout=timeout_s)

    def initialise(self) -> None:
        """A new cluster, unless the folder holds one: a fresh password and loopback port."""
        if not (self.pg_bin / "initdb").exists():
            raise PostgresMissing(
                f"PPO_PREFECT_DB=postgres needs PostgreSQL 15 (apt-get install postgresql-15) or PPO_PG_BIN naming "
                f"its bin directory; {self.pg_bin / 'initdb'} is missing"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        if (self.data / "PG_VERSION").exists():
            return
        for name, text in (("password", secrets.token_hex(24)), ("port", str(_free_loopback_port()))):
            path = self.folder / name
            path.write_text(text + "\n")
            path.chmod(0o600)
        if os.geteuid() == 0:  # the cluster's user must own its folder
            for path in (self.folder, self.folder / "password", self.folder / "port"):
                shutil.chown(path, "postgres")
        # Over TCP (loopback only) a password; on the socket, in a folder only the
        # cluster's user can enter, that user itself (to create the database).
        made = self._run("initdb", "-D", str(self.data), "-U", USER, f"--pwfile={self.folder / 'password'}", "-E",
                         "UTF8", "--auth-host=scram-sha-256", "--auth-local=trust", timeout_s=300)
        (self.folder / "initdb.log").write_text(made.stdout + made.stderr)
        if made.returncode != 0:
            raise PostgresFailed(f"initdb failed; see {self.folder / 'initdb.log'}")

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", timeout_s=60).returncode == 0

    def start(self, timeout_s: float = 120) -> bool:
        """Starts the cluster (True), or finds it running (False); then makes sure the
        `prefect` database exists."""
        started = not self.running()
        if started:
            log = self.folder / "postgres.log"
            begun = self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-w", "-t", str(int(timeout_s)), "-o",
                              f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder}", "start",
                              timeout_s=timeout_s + 30)
            if begun.returncode != 0:
                raise PostgresFailed(f"PostgreSQL did not start on 127.0.0.1:{self.port}; see {log}")
        found = self._run("psql", "-h", str(self.folder), "-p", str(self.port), "-U", USER, "-d", "postgres", "-tAc",
                          "SELECT 1 FROM pg_database WHERE datname = 'prefect'", timeout_s=60)
        if found.stdout.strip() != "1":
            created = self._run("createdb", "-h", str(self.folder), "-p", str(self.port), "-U", USER, "prefect",
                                timeout_s=60)
            if created.returncode != 0:
                raise PostgresFailed(f"could not create the prefect database: {created.stderr.strip()}")
        return started

    def stop(self, timeout_s: float = 60) -> bool:
        """Stops a running cluster (True), or finds none (False)."""
        if not (self.data / "postmaster.pid").exists():
            return False
        stopped = self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", str(int(timeout_s)), "stop",
                            timeout_s=timeout_s + 30)
        if stopped.returncode != 0:
            raise PostgresFailed(f"PostgreSQL in {self.data} did not stop; see {self.folder / 'postgres.log'}")
        return True


@contextmanager
def throwaway_cluster(pg_bin: Path = PG_BIN) -> Iterator[str]:
    """Yields the URL of a fresh `prefect` database on a cluster of its own, stopped and
    removed on exit (a benchmark's own Prefect server)."""
    cluster = LocalPostgres(Path(tempfile.mkdtemp(prefix="ppo-pg-", dir="/tmp")), pg_bin)
    try:
        cluster.initialise()
        cluster.start()
        yield cluster.url()
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(cluster.folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    """`start` prints the database URL on stdout (it holds the password: serve.sh hands it
    to the server's environment only) and checks that the database answers, stopping a
    cluster it started when it does not; `stop` stops it. Problems go to stderr as
    `serve:` / `stop:` lines."""
    parser = argparse.ArgumentParser(prog="python -m deployments.local_postgres")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    cluster = LocalPostgres(args.folder)
    if args.action == "stop":
        try:
            if cluster.stop(args.timeout):
                print("stop: postgres stopped")
        except PostgresFailed as error:
            print(f"stop: {error}", file=sys.stderr)
            return 1
        return 0
    from deployments.database import DatabaseUnavailable, check

    try:
        cluster.initialise()
        started = cluster.start(args.timeout)
    except PostgresMissing as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    except PostgresFailed as error:
        print(f"serve: {error}", file=sys.stderr)
        return 1
    state = "started PostgreSQL on" if started else "PostgreSQL already running on"
    print(f"serve: {state} 127.0.0.1:{cluster.port}, data {cluster.data}", file=sys.stderr)
    try:
        check(cluster.url(), min(args.timeout, 30.0))
    except DatabaseUnavailable as error:
        print(f"serve: {error}", file=sys.stderr)
        if started:  # leave nothing running
            cluster.stop()
        return 1
    print(cluster.url())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
