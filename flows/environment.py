"""Defaults for the process that runs the flow, measured on 2-core machines
(DESIGN.md, "Facts measured"). Each is a default only: a user's own setting wins."""

from __future__ import annotations

import os

DEFAULTS = {
    # A fresh embedded-API database takes 19-25 s to start here; the default 20 s
    # timeout fails about half the time.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # No internet: analytics would log an error on every start.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Ray 2.60 otherwise writes an auth token into the home directory.
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
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
