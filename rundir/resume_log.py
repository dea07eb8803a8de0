"""Where resume speaks: the flow run's log inside Prefect, a plain logger outside it."""

from __future__ import annotations

import logging


def resume_logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:
        return logging.getLogger("ppo.resume")
