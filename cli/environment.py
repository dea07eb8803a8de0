"""Defaults for the process that runs the flow, each for a reason DESIGN.md's "Facts
measured" gives the figures of. Each is a default only: a user's own setting wins."""

from __future__ import annotations

import json
import os
import shlex
import sys

from processes.ray_session import RAY_DEFAULTS

# The event kinds a training run sends every iteration (docs/prefect-ui.md, "What a long
# run keeps"); a failed or crashed task run's event is not among them.
PER_ITERATION_EVENTS = (
    "prefect.task-run.Pending", "prefect.task-run.Running", "prefect.task-run.Completed",
    "prefect.artifact.created", "prefect.artifact.updated", "prefect.artifact-collection.updated",
)
# A tiny run sends about 90 events a second (4 KB each in PostgreSQL): what a server
# holds is about (retention + loop) of them (docs/performance.md, "A long run's footprint").
EVENT_RETENTION_S = 120
VACUUM_LOOP_S = 60

DEFAULTS = {
    # A fresh embedded-API database can take longer to start on a small machine than
    # Prefect's default timeout allows (DESIGN.md, "Facts measured").
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # No internet: analytics would log an error on every start.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "TOKENIZERS_PARALLELISM": "false",
    # The Prefect server records each task-run state event in its own SQLite
    # transaction by default, server CPU taken from the cores the actors train on.
    # Batched, every state is still recorded, a little later (docs/performance-log.md section 3).
    # They reach the embedded server the flow starts.
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "50",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "50",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "20",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
    # S-FOOT-1: a server that keeps events (`make serve`, a team's PostgreSQL) keeps the
    # per-iteration kinds (three task-run states per stage, artifact updates) for
    # EVENT_RETENTION_S, vacuumed every VACUUM_LOOP_S, instead of Prefect's 7 days:
    # they were 78 % of a long run's database. Flow-run, deployment and failure events
    # keep the 7 days. The embedded API keeps none (processes/temporary_api.py).
    "PREFECT_SERVER_SERVICES_DB_VACUUM_EVENT_RETENTION_OVERRIDES": json.dumps(
        dict.fromkeys(PER_ITERATION_EVENTS, EVENT_RETENTION_S), separators=(",", ":")
    ),
    "PREFECT_SERVER_SERVICES_DB_VACUUM_LOOP_SECONDS": str(VACUUM_LOOP_S),
    **RAY_DEFAULTS,
}

CLI_DEFAULTS = {
    # The terminal shows one line per iteration; every task's state change still
    # goes to the Prefect API (and so the UI) at full detail.
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
}


def apply_default_environment(cli: bool = True) -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    if cli:
        for key, value in CLI_DEFAULTS.items():
            os.environ.setdefault(key, value)


def tuning_exports() -> str:
    """Shell `export` lines for the server and Ray tuning, each keeping a value the
    user's shell already set: `deployments/serve.sh` gives a standing server and its
    worker the settings the embedded run uses."""
    served = ("PREFECT_SERVER_SERVICES_", "RAY_ENABLE_ZERO_COPY", "RAY_task_events")
    keys = [k for k in DEFAULTS if k.startswith(served)]
    # POSIX sh: the lines go into env.sh, which make's recipes source with /bin/sh.
    return "\n".join(f'[ -n "${{{k}:-}}" ] || {k}={shlex.quote(DEFAULTS[k])}; export {k}' for k in keys)


if __name__ == "__main__" and sys.argv[1:] == ["--export-tuning"]:
    print(tuning_exports())
