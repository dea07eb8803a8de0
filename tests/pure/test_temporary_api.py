"""The command line's temporary Prefect API (processes/temporary_api.py, issue 19): none
when a standing server is configured, a failed start named, and never left behind by
a command that was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from compat.prefect_compat import standing_api_possible
from processes.temporary_api import TemporaryApi, TemporaryApiFailed, start_temporary_api
from tests.conftest import REPO_ROOT


def test_a_standing_server_means_no_temporary_api(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert start_temporary_api() is None


def test_a_server_launched_early_is_stopped_when_prefect_names_a_standing_api():
    """The early launch guesses from the files it can read; Prefect's own settings decide."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    early = TemporaryApi(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]), 9, [], {})
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert start_temporary_api(early) is None
    assert early.process.wait(timeout=10) is not None


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("env", None),
        ("profiles.toml", '[profiles.team]\nPREFECT_API_URL = "http://prefect.internal:4200/api"\n'),
        ("profiles.toml", '[profiles.default]\nPREFECT_SERVER_EPHEMERAL_ENABLED = "false"\n'),
        (".env", "PREFECT_API_URL=http://prefect.internal:4200/api\n"),
        ("prefect.toml", '[api]\nurl = "http://prefect.internal:4200/api"\n'),
        ("pyproject.toml", '[tool.prefect.api]\nurl = "http://prefect.internal:4200/api"\n'),
    ],
)
def test_no_early_launch_where_a_standing_api_may_be_configured(tmp_path, where, text):
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    environ = {"PREFECT_HOME": str(home)}
    assert standing_api_possible(environ, cwd) is False  # nothing anywhere: launch at once
    (cwd / "pyproject.toml").write_text('[project]\nname = "unrelated"\n')
    (home / "profiles.toml").write_text('active = "default"\n[profiles.default]\nPREFECT_LOGGING_LEVEL = "INFO"\n')
    assert standing_api_possible(environ, cwd) is False  # files that name no API
    if where == "env":
        environ["PREFECT_API_URL"] = "http://prefect.internal:4200/api"
    else:
        (home if where == "profiles.toml" else cwd).joinpath(where).write_text(text)
    assert standing_api_possible(environ, cwd) is True


def test_a_server_that_exits_while_starting_is_named():
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    api = TemporaryApi(process, port=9, command=[], env={})
    with pytest.raises(TemporaryApiFailed, match="exited with code 7"):
        api.wait_until_up(timeout_s=30)


def test_a_server_whose_app_fails_to_start_is_named_at_once_not_relaunched_until_the_timeout():
    """uvicorn exits 3 for any failed start; only a port some other process holds is
    worth another launch on another port."""
    from processes.temporary_api import free_loopback_port

    failing = [sys.executable, "-c", "import sys; sys.exit(3)"]
    process = subprocess.Popen(failing)
    api = TemporaryApi(process, port=free_loopback_port(), command=failing, env={})
    started = time.monotonic()
    with pytest.raises(TemporaryApiFailed, match="exited with code 3"):
        api.wait_until_up(timeout_s=30)
    assert time.monotonic() - started < 10


def test_a_stop_while_the_server_is_still_starting_ends_the_wait_at_once():
    """S-STOP-4: on a loaded machine the server can take longer than a stop's grace; a
    stop signalled meanwhile is honoured there, not after the server answers, and the
    server that never answered is killed."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # never answers
    api = TemporaryApi(process, port=9, command=[], env={})
    stopping = []
    threading.Timer(0.3, stopping.append, args=("SIGTERM",)).start()
    started = time.monotonic()
    try:
        assert api.wait_until_up(timeout_s=30, abandon=lambda: stopping) is False
        assert time.monotonic() - started < 10
        api.stop()  # it never answered: killed, with no shutdown of its own to print under the run's last line
        assert process.returncode == -signal.SIGKILL
    finally:
        process.kill()


class _UpAlready:
    api_url = "http://127.0.0.1:9/api"

    def wait_until_up(self, timeout_s: float) -> None:
        pass


@pytest.mark.parametrize("user_setting", [None, "60"])
def test_flow_runs_against_the_temporary_api_send_no_heartbeats_unless_asked(monkeypatch, user_setting):
    """Nothing could miss a heartbeat of a server that ends with the command; each flow
    run's end waited up to a second for its heartbeat thread."""
    from prefect.settings import get_current_settings

    from cli.command import temporary_api_settings

    if user_setting is None:
        monkeypatch.delenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", raising=False)
    else:
        monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", user_setting)
    monkeypatch.delenv("PREFECT_RUNNER_HEARTBEAT_FREQUENCY", raising=False)
    monkeypatch.setattr("prefect.logging.handlers.APILogWorker.drain_all", lambda timeout=None: None)
    monkeypatch.setattr("prefect.events.worker.EventsWorker.drain_all", lambda timeout=None: None)
    with temporary_api_settings(_UpAlready()):
        settings = get_current_settings()
        assert settings.api.url == "http://127.0.0.1:9/api"
        expected = None if user_setting is None else int(user_setting)
        assert settings.flows.heartbeat_frequency == expected


KILLED_PARENT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from processes.temporary_api import _launch
    child = _launch([sys.executable, "-c", "import time; time.sleep(120)"], 9, {})
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_the_server_ends_when_the_command_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, str(REPO_ROOT)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the temporary API outlived the command that started it")
