"""Crashed runs resume by themselves (S-FAULT-5): deployments/automations.yaml
reschedules a crashed run of an `auto-resume` deployment, and the flow bounds how
often (flows/training.py automatic_resumes). The automation is checked with
Prefect's own trigger matching; the whole loop runs through a real server and worker
in tests/services/test_deployment.py (slow)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import uuid4

import pytest
import yaml
from prefect.client.schemas.objects import State, StateType
from prefect.server.events.schemas.automations import AutomationCore
from prefect.server.events.schemas.events import ReceivedEvent

from flows.auto_resume import AUTO_RESUME_STATE, automatic_resumes
from tests.conftest import REPO_ROOT

WORKER_REPORT = "Flow run infrastructure exited with non-zero status code -9. Process was terminated by a signal."
RUNNER_REPORT = "Process exited with status code: -9. Process was terminated by a signal."


def _automation() -> AutomationCore:
    data = yaml.safe_load((REPO_ROOT / "deployments" / "automations.yaml").read_text())
    (automation,) = data["automations"]
    return AutomationCore.model_validate(automation)


def _event(state: str, message: str, tags: list[str]) -> ReceivedEvent:
    return ReceivedEvent(
        occurred=datetime.now(timezone.utc),
        event=f"prefect.flow-run.{state}",
        resource={
            "prefect.resource.id": f"prefect.flow-run.{uuid4()}",
            "prefect.state-message": message,
            "prefect.state-type": state.upper(),
        },
        related=[{"prefect.resource.id": f"prefect.tag.{tag}", "prefect.resource.role": "tag"} for tag in tags],
        id=uuid4(),
    )


def test_the_automation_waits_for_a_restart_of_a_crashed_auto_resume_run_then_reschedules_it():
    automation = _automation()
    trigger = automation.trigger
    # A crash opens a window per flow run (Prefect 3.9 may report one crash twice).
    assert trigger.posture == "Proactive" and trigger.for_each == {"prefect.resource.id"}
    for report in (RUNNER_REPORT, WORKER_REPORT):
        assert trigger.covers(_event("Crashed", report, ["ppo", "gpu", "auto-resume"]))
        assert trigger.starts_after("prefect.flow-run.Crashed")
        assert not trigger.covers(_event("Crashed", report, ["ppo", "cpu"]))  # not opted in
    # A restart within the window (a person's Retry, a worker taking the run) means no
    # reschedule; a second crash report does not count as a restart.
    for restarted in ("AwaitingRetry", "Pending", "Running", "AutoResume"):
        assert trigger.expects(f"prefect.flow-run.{restarted}")
    assert not trigger.expects("prefect.flow-run.Crashed")
    assert trigger.within.total_seconds() >= 60  # past the worker's late second report (about 30 s under load)
    # Failed (a raised error, AutoResumeExhausted included) never opens a window.
    assert not trigger.starts_after("prefect.flow-run.Failed")
    (action,) = automation.actions
    assert action.type == "change-flow-run-state" and action.state == StateType.SCHEDULED
    assert action.name == AUTO_RESUME_STATE


def test_the_public_deployment_opts_in_and_the_cpu_one_keeps_manual_retry():
    deployments = yaml.safe_load((REPO_ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    tags = {d["name"]: d["tags"] for d in deployments}
    assert "auto-resume" in tags["public-4gpu"] and "auto-resume" not in tags["tiny-cpu"]


def _history(*steps: tuple[StateType, str]) -> list[State]:
    start = datetime(2026, 12, 1, tzinfo=timezone.utc)
    states = [
        State(type=kind, name=name, timestamp=start + timedelta(seconds=i)) for i, (kind, name) in enumerate(steps)
    ]
    return list(reversed(states))  # the API's order is not relied on


SCHEDULED, RUNNING = (StateType.SCHEDULED, "Scheduled"), (StateType.RUNNING, "Running")
CRASHED = (StateType.CRASHED, "Crashed")
AUTO = (StateType.SCHEDULED, AUTO_RESUME_STATE)
RETRY = (StateType.SCHEDULED, "AwaitingRetry")


@pytest.mark.parametrize("steps, used", [
    ([SCHEDULED, RUNNING], 0),
    ([SCHEDULED, RUNNING, CRASHED, AUTO], 1),
    ([SCHEDULED, RUNNING, CRASHED, AUTO, RUNNING, CRASHED, AUTO], 2),
    # One crash reported twice, the run rescheduled twice before it ran again: one attempt.
    ([SCHEDULED, RUNNING, CRASHED, AUTO, CRASHED, AUTO], 1),
    # A person's Retry starts a fresh budget.
    ([SCHEDULED, RUNNING, CRASHED, AUTO, RUNNING, CRASHED, AUTO, RUNNING, (StateType.FAILED, "Failed"), RETRY], 0),
])
def test_automatic_resumes_count_crashed_attempts_since_a_person_scheduled_the_run(steps, used):
    assert automatic_resumes(_history(*steps)) == used
