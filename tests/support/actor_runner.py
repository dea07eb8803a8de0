"""The flow's runner without Prefect, for tests of the actor wiring: role calls go to the
Ray actors exactly as in a flow run, and each stage body runs here once its calls
resolved, with no flow run around it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

from flows.flow_runner import FlowRunner
from tasks.prefect_tasks import resolve


class ActorRunner(FlowRunner):
    def _run(
        self, body: Callable[..., Any], iteration: int, args: tuple[Any, ...], upstream: Any, waits: Any = ()
    ) -> Any:
        *values, _ = resolve((*args, list(waits)))  # what the stage only waits for, as its task does
        return body(iteration, *values)

    def _submit(self, body: Callable[..., Any], iteration: int, args: tuple[Any, ...], upstream: Any) -> Any:
        return SimpleNamespace(result=lambda: body(iteration, *resolve(args)))
