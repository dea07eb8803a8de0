"""Defaults for the process that runs the flow, measured on 2-core machines
(DESIGN.md, "Facts measured"). Each is a default only: a user's own setting wins."""

from __future__ import annotations

import os
import sys

from processes.ray_session import RAY_DEFAULTS

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
    keys = [k for k in DEFAULTS if k.startswith(("PREFECT_SERVER_SERVICES_", "RAY_ENABLE_ZERO_COPY"))]
    return "\n".join(f'export {k}="${{{k}:-{DEFAULTS[k]}}}"' for k in keys)


if __name__ == "__main__" and sys.argv[1:] == ["--export-tuning"]:
    print(tuning_exports())
