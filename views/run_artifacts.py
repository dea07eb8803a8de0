"""Which flow run a training run's artifacts attach to: the `ppo` flow run itself.

Prefect attaches an artifact to the flow run it is created in, and the iterations run
inside block subflows (flows/blocks.py), so a history table or a samples table made
there would land on the block's run instead of the run a user opens. The flow runner
sets this context variable to the `ppo` flow run before it enters a block (Prefect
copies the context into the threads its tasks run in), and every artifact of the run
names it (docs/prefect-ui.md).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator
from uuid import UUID

from prefect.context import FlowRunContext

_RUN_FLOW_RUN: ContextVar[UUID | None] = ContextVar("ppo_run_flow_run", default=None)


def current_flow_run_id() -> UUID | None:
    context = FlowRunContext.get()
    return context.flow_run.id if context is not None and context.flow_run is not None else None


def run_flow_run_id() -> UUID | None:
    """The `ppo` flow run, from inside it or any of its block subflows and their
    tasks; None outside any flow run (the in-process runner)."""
    return _RUN_FLOW_RUN.get() or current_flow_run_id()


@contextmanager
def artifacts_on_this_run() -> Iterator[None]:
    """Inside, the artifacts of the flow run that is running now go on to name it,
    also from the subflows it starts."""
    token = _RUN_FLOW_RUN.set(run_flow_run_id())
    try:
        yield
    finally:
        _RUN_FLOW_RUN.reset(token)
