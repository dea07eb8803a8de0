"""Resuming a deployment's run by itself, bounded (S-FAULT-5): a crashed flow process is
rescheduled by deployments/automations.yaml under the state `AutoResume`; this counts
those reschedules since a person last scheduled the run and fails it past the bound."""

from __future__ import annotations

from typing import Any

from prefect.client.schemas.objects import StateType

from flows.run_report import say


AUTO_RESUME_STATE = "AutoResume"  # the state name deployments/automations.yaml reschedules a crashed run under


class AutoResumeExhausted(RuntimeError):
    """A crashed run came back more often than its `auto_resume_attempts` allow."""


def crash_resumes(auto_resume_attempts: int) -> int:
    """How many automatic resumes this flow run has used: the times the automation
    rescheduled it after its process crashed. Past the bound the run fails (Failed,
    which the automation leaves alone) instead of crashing again and again."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return 0
    with get_client(sync_client=True) as client:
        used = automatic_resumes(client.read_flow_run_states(flow_run.id))
    if used > auto_resume_attempts:
        raise AutoResumeExhausted(
            f"the flow process crashed {used} times and auto_resume_attempts={auto_resume_attempts}; not resuming "
            "again by itself. Find the cause in the crashed attempts' logs, then run it again (or press Retry)."
        )
    if used:
        say(f"auto-resume: attempt {used} of {auto_resume_attempts} after the flow process crashed; "
            "resuming from the last committed boundary")
    return used


def automatic_resumes(states: list[Any]) -> int:
    """Crashed attempts the automation rescheduled since a person last scheduled the
    run (created it, or pressed Retry: a Retry after the bound starts a fresh budget).
    Two reschedules with no attempt running between them are one crash."""
    used, ran = 0, False
    for state in sorted(states, key=lambda state: state.timestamp):
        if state.name == AUTO_RESUME_STATE:
            used += ran
            ran = False
        elif state.type == StateType.SCHEDULED:
            used, ran = 0, False
        elif state.type == StateType.RUNNING:
            ran = True
    return used
