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
