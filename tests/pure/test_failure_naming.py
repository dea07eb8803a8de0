"""How `FlowRunner.explain` words a fault on a multi-node cluster (S-FAULT-1): the role,
and the node with what it held when the cluster lists that node as gone. The cluster
is faked here (the node map the runner asks for at start-up, and the cluster's node
list); tests/services/test_multinode.py (-m slow) loses a real node."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorUnavailableError, ObjectLostError

import flows.flow_runner as runners
from tasks.prefect_tasks import StageTimeout

POLICY_ID, REFERENCE_ID = "aa" * 16, "bb" * 16
NODE_A, NODE_B = "1" * 56, "2" * 56


class Roles:
    pool = None  # one rollout engine: no engine pool

    def items(self):
        return [("policy", object()), ("reference", object())]

    def ranks(self, role):
        return [dict(self.items())[role]]


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(runners, "actor_whereabouts", lambda actors: {
        "policy": (POLICY_ID, NODE_A), "reference": (REFERENCE_ID, NODE_B)})
    monkeypatch.setattr(runners, "node_addresses", lambda: {NODE_A: ("10.0.0.5", True), NODE_B: ("10.0.0.6", False)})
    monkeypatch.setattr(runners, "kill_quietly", lambda handle: None)  # the real one would start a Ray
    return runners.FlowRunner(Roles())


def test_an_actor_on_a_lost_node_is_named_with_the_node_and_what_it_held(runner):
    error = ActorUnavailableError("Connection refused", bytes.fromhex(REFERENCE_ID))
    assert runner.explain(error) == (
        "the reference actor on node 22222222 (10.0.0.6) is gone: node 22222222 (10.0.0.6) left the Ray cluster "
        f"(it held reference): The actor {REFERENCE_ID} is unavailable: Connection refused. The task may or may not "
        "have been executed on the actor."
    )


def test_an_actor_on_a_live_node_is_named_without_blaming_the_node(runner):
    message = runner.explain(ActorUnavailableError("Connection refused", bytes.fromhex(POLICY_ID)))
    assert message.startswith("the policy actor on node 11111111 (10.0.0.5) is gone: The actor ")


def test_an_input_lost_with_its_node_names_the_node(runner):
    message = runner.explain(ObjectLostError("cc" * 28, None, ""))
    assert message.startswith("node 22222222 (10.0.0.6) left the Ray cluster (it held reference): Failed to retrieve")


def test_a_stage_timeout_on_a_cluster_names_the_node_the_stuck_actor_ran_on(runner):
    class Late:
        def task_id(self):
            return self

        def actor_id(self):
            return bytes.fromhex(POLICY_ID)  # `.hex()` as Ray's ActorID has

    message = runner.explain(StageTimeout([Late()], 20.0))
    assert message == (
        "no result from the policy actor within 20 s (rl.stage_timeout_seconds=20); killed it so it holds no device; "
        "it ran on node 11111111 (10.0.0.5)"
    )


def test_every_stage_name_has_its_task_and_every_task_body_reads_what_it_takes():
    """One way to wait (S-FLOW-1): the task list is the stage list, and a stage body
    takes only what it reads; what a stage only waits for goes through `waits=`."""
    import inspect

    from contracts.stage_names import ITERATION_TASKS, SAVE_ARTIFACT_TASK
    from tasks.prefect_tasks import STAGE_BODIES, TASKS

    assert [body.__name__ for body in STAGE_BODIES] == [*ITERATION_TASKS, SAVE_ARTIFACT_TASK]
    assert [task.name for task in TASKS.values()] == [*ITERATION_TASKS, SAVE_ARTIFACT_TASK]
    for body in STAGE_BODIES:
        source = inspect.getsource(body).split('"""')[-1]  # the code after the docstring
        unread = [name for name in inspect.signature(body).parameters if name != "iteration" and name not in source]
        assert unread == [], f"{body.__name__} takes {unread} without reading it: pass it as waits="


def test_a_constructor_failure_ends_on_the_raised_exception_whatever_its_class_is_called():
    # Ray's text for an actor whose constructor raised: its repr first, the traceback
    # after; a class not named *Error (Arrow's) must still be the line the run ends on.
    from processes.actors import startup_cause

    died = (
        "The actor died because of an error raised in its creation task, \x1b[36mray::DataRole.__init__()\x1b[39m "
        "(pid=1, ip=192.0.2.2, actor_id=ab, repr=<roles.data_role.DataRole object at 0x7f>)\n"
        "           ^^^^^^^^^^^^\n"
        '  File "/x/roles/data_role.py", line 58, in __init__\n'
        "    self.rows = load_rows(data)\n"
        "pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer\n"
        "second line: detail"
    )
    assert startup_cause(RuntimeError(died)) == "pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer"
    assert startup_cause(FileNotFoundError("no model at /m")) == "FileNotFoundError: no model at /m"
