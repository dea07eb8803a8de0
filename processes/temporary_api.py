"""The temporary Prefect API of a command-line run with no standing server, launched the
moment the command has read its config instead of when the flow is first called:
Prefect's own server command and settings, on loopback only (docs/architecture.md,
"How a run starts"). A run whose settings could name a standing API starts none.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from compat.prefect_compat import SERVER_ENV, standing_api_possible, temporary_api_supported
from compat.prefect_schema import sqlite_database_problem
from deployments.database import DatabaseUnavailable, check, connection_url
from processes.parent_death import parent_death_signal_setter

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
# S-FOOT-1: the temporary API serves no UI, and nothing else reads Prefect's event log
# (automations act on events as they arrive, not on stored ones), so it stores none:
# they were 78 % of a long run's database. A user's own setting wins.
TEMPORARY_API_DEFAULTS = {
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
    "PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED": "false",
}
DATABASE_CHECK_TIMEOUT_S = 5.0  # the server has already exited: this only says why
PORT_IN_USE_EXIT = 3  # uvicorn's exit code for a failed start: a taken port (pick another) or a broken app


class TemporaryApiFailed(RuntimeError):
    """The temporary API exited while starting or did not answer in time."""


@dataclass
class TemporaryApi:
    process: subprocess.Popen
    port: int
    command: list[str]
    env: dict[str, str]
    answered: bool = False  # /api/health has answered: the server is up and serving

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def wait_until_up(self, timeout_s: float, abandon: Callable[[], object] = lambda: None) -> bool:
        """Block until `/api/health` answers 200 (True), or until `abandon()` says the run
        stops meanwhile (False: on a loaded machine the server may take longer than a
        stop's grace); a server that exits or does not answer in time is a
        TemporaryApiFailed naming which."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if abandon():
                return False
            if self.process.poll() == PORT_IN_USE_EXIT and port_taken(self.port):
                # Another process took the port between our probe and the server's bind.
                self.port = free_loopback_port()
                self.process = _launch(self.command, self.port, self.env)
                continue
            if self.process.poll() is not None:
                cause = self._database_problem()
                raise TemporaryApiFailed(
                    f"the temporary Prefect API exited with code {self.process.returncode} while starting"
                    + (f": {cause}" if cause else "")
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        self.answered = True
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise TemporaryApiFailed(
            f"the temporary Prefect API on 127.0.0.1:{self.port} did not answer within {timeout_s:g} s "
            "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)"
        )

    def _database_problem(self) -> str | None:
        """Why Prefect's server could not start on its database, when this can tell: one
        written by a newer Prefect, or a PostgreSQL that is down or refuses the password
        (Prefect itself only exits). Never the password."""
        url = connection_url(self.env)
        if url is None:
            home = Path(self.env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
            return sqlite_database_problem(home)
        try:
            check(url, DATABASE_CHECK_TIMEOUT_S)
        except DatabaseUnavailable as error:
            return f"{error}; start it, or correct PREFECT_SERVER_DATABASE_CONNECTION_URL"
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM and a wait for a server that serves; a server that never answered
        (a stop while it started) has served nothing and is killed, where SIGTERM would
        have it print its cancelled start-up under the run's last line."""
        if self.process.poll() is None and not self.answered:
            self.process.kill()
            self.process.wait()
        elif self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def launch_early() -> TemporaryApi | None:
    """The temporary API, launched without importing Prefect, when nothing in sight
    could name a standing API; None leaves the decision to `start_temporary_api`.
    The server reads the same environment, profile and settings files as Prefect
    would hand it, so its settings are the ones a later launch would pass."""
    if standing_api_possible(os.environ, Path.cwd()) or not temporary_api_supported():
        return None
    return _launch_api(server_command(), {**TEMPORARY_API_DEFAULTS, **os.environ, **SERVER_ENV})


def server_command() -> list[str]:
    """Prefect's own server command (uvicorn on loopback), over Prefect's app wrapped by
    processes/temporary_server.py."""
    return [
        sys.executable, "-m", "uvicorn", "--app-dir", PROJECT_ROOT, "--factory",
        "processes.temporary_server:create_app", "--host", "127.0.0.1", "--log-level", "error", "--lifespan", "on",
    ]


def start_temporary_api(early: TemporaryApi | None = None) -> TemporaryApi | None:
    """A temporary API for this command (`early`, or one launched now), or None when the
    run has a standing API (PREFECT_API_URL, in the environment or the active Prefect
    profile) or temporary APIs are turned off; an `early` one is then stopped."""
    try:
        from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, get_current_settings

        standing = bool(PREFECT_API_URL.value()) or not PREFECT_SERVER_EPHEMERAL_ENABLED.value()
    except BaseException:
        if early is not None:
            early.stop()
        raise
    if standing or not temporary_api_supported():  # Prefect's settings name an API, or Prefect starts its own
        if early is not None:
            early.stop()
        return None
    api = early or _launch_api(
        server_command(),
        {
            **TEMPORARY_API_DEFAULTS, **os.environ, **SERVER_ENV,
            **get_current_settings().to_environment_variables(exclude_unset=True),
        },
    )
    return api  # this process's settings name it for the command (cli/command.py)


def _launch_api(command: list[str], env: dict[str, str]) -> TemporaryApi:
    port = free_loopback_port()
    return TemporaryApi(_launch(command, port, env), port, command, env)


def _launch(command: list[str], port: int, env: dict[str, str]) -> subprocess.Popen:
    """On Linux the server gets SIGTERM when this process dies, even by SIGKILL (Prefect's
    own temporary server outlives a killed flow process); elsewhere it is stopped on exit.
    In a session of its own, so a Ctrl-C to the terminal's process group reaches the run,
    which stops cleanly through this API (S-STOP-1), and not the API itself."""
    return subprocess.Popen(
        [*command, "--port", str(port)], env=env, stdin=subprocess.DEVNULL,
        preexec_fn=parent_death_signal_setter(signal.SIGTERM), start_new_session=True,
    )


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
