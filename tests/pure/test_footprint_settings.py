"""S-FOOT-1: the settings that bound a long run's footprint reach the servers that
need them: the embedded API stores no events, a standing server (`make serve`) keeps
the per-iteration kinds for minutes, and a user's own value wins everywhere."""

from __future__ import annotations

import json
import subprocess

from cli.environment import EVENT_RETENTION_S, PER_ITERATION_EVENTS, tuning_exports


def _sourced(environment: dict[str, str], name: str) -> str:
    script = f'{tuning_exports()}\nprintf %s "${name}"'
    return subprocess.run(["sh", "-c", script], env=environment, capture_output=True, text=True,
                          check=True).stdout


def test_make_serve_keeps_each_per_iteration_event_kind_for_minutes_and_a_users_value_wins():
    key = "PREFECT_SERVER_SERVICES_DB_VACUUM_EVENT_RETENTION_OVERRIDES"
    overrides = json.loads(_sourced({"PATH": "/usr/bin:/bin"}, key))
    assert overrides == dict.fromkeys(PER_ITERATION_EVENTS, EVENT_RETENTION_S)
    assert "prefect.task-run.Completed" in overrides and "prefect.task-run.Failed" not in overrides
    assert "prefect.flow-run.Crashed" not in overrides  # the auto-resume automation's trigger, kept 7 days
    assert _sourced({"PATH": "/usr/bin:/bin", key: "{}"}, key) == "{}"
    assert _sourced({"PATH": "/usr/bin:/bin"}, "RAY_task_events_report_interval_ms") == "0"


def test_the_embedded_api_stores_no_events_unless_the_user_says_so(monkeypatch):
    import processes.temporary_api as temporary_api

    launched: list[dict[str, str]] = []
    monkeypatch.setattr(temporary_api, "standing_api_possible", lambda environ, cwd: False)
    monkeypatch.setattr(temporary_api, "temporary_api_supported", lambda: True)
    monkeypatch.setattr(temporary_api, "_launch_api", lambda command, env: launched.append(env))
    key = "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"
    monkeypatch.delenv(key, raising=False)
    temporary_api.launch_early()
    monkeypatch.setenv(key, "true")
    temporary_api.launch_early()
    assert [env[key] for env in launched] == ["false", "true"]


def test_a_completed_task_runs_engine_line_is_dropped_and_every_other_line_kept():
    """Half a tiny iteration's log rows were Prefect's `Finished in state Completed()`,
    which the task run's state already shows; a failure's line and the task's own
    metrics stay."""
    import logging

    from compat.prefect_compat import quiet_completed_task_lines

    quiet_completed_task_lines()
    quiet_completed_task_lines()  # once is enough, twice changes nothing
    kept: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: kept.append(record.getMessage())
    logger = logging.getLogger("prefect.task_runs")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        logger.info("Finished in state Completed()")
        logger.info("train/kl=0.01, train/reward_mean=0.5")
        logger.error("Finished in state Failed('Task run encountered an exception RuntimeError')")
        logger.info("Finished in state Cancelled()")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert kept == [
        "train/kl=0.01, train/reward_mean=0.5",
        "Finished in state Failed('Task run encountered an exception RuntimeError')",
        "Finished in state Cancelled()",
    ]


def test_compacting_a_database_that_is_not_there_creates_none_and_says_where(tmp_path):
    """A served API whose SQLite lives elsewhere: the run's process finds no file under
    its own PREFECT_HOME and must not create one (the server would never read it)."""
    import uuid

    import pytest

    from compat.prefect_history import HistoryCompactionUnavailable, PrefectDatabase, compact_flow_run

    missing = tmp_path / "home" / "prefect.db"
    with pytest.raises(HistoryCompactionUnavailable, match=str(missing)):
        compact_flow_run(PrefectDatabase(f"sqlite+aiosqlite:///{missing}"), uuid.uuid4())
    assert not missing.exists() and not missing.parent.exists()
    assert PrefectDatabase("postgresql+asyncpg://u:secret@db:5432/prefect").dialect == "postgresql"
    empty = tmp_path / "other.db"
    import sqlite3
    sqlite3.connect(empty).close()
    with pytest.raises(HistoryCompactionUnavailable, match="lacks task_run_state, task_run"):
        compact_flow_run(PrefectDatabase(f"sqlite+aiosqlite:///{empty}"), uuid.uuid4())


def test_a_nearly_full_disk_under_the_prefect_database_stops_the_run_before_its_next_block(tmp_path):
    """S-FOOT-1: a database that fills its disk is named, with the settings that bound
    it, before a block starts writing there (on a real 8 MiB tmpfs; FlowIterationLoop.block
    raises it as PrefectDatabaseFull)."""
    import pytest
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    from flows.recording import database_space_problem

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        full = disk / "prefect.db"
        full.write_bytes(b"")
        roomy = tmp_path / "prefect.db"
        roomy.write_bytes(b"")
        with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{roomy}"}):
            assert database_space_problem() is None
        with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{full}"}):
            problem = database_space_problem()
        assert problem is not None and str(full) in problem and "MiB left on its disk" in problem
        assert "PPO_TASK_HISTORY" in problem and "resumes from the last committed boundary" in problem
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
