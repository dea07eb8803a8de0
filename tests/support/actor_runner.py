"""The flow's runner without Prefect, for tests of the actor wiring: role calls go to the
Ray actors exactly as in a flow run, and each stage body runs here once its calls
resolved, with no flow run around it."""

from __future__ import annotations

import time
from typing import Any, Callable

from flows.failures import naming_failures
from flows.flow_runner import FlowRunner
from tasks.prefect_tasks import resolve


class ActorRunner(FlowRunner):
    def stage(self, body: Callable[..., Any], iteration: int, *args: Any) -> Any:
        started = time.perf_counter()
        with self._bounded(), naming_failures(body.__name__, iteration, self.explain):
            result = body(iteration, *resolve(args))
        self.seconds[body.__name__] = time.perf_counter() - started
        return result

    def concurrent_stages(
        self, label: str, iteration: int, *stages: tuple[Callable[..., Any], tuple[Any, ...]]
    ) -> list[Any]:
        started = time.perf_counter()
        results = []
        with self._bounded():
            for body, args in stages:
                with naming_failures(body.__name__, iteration, self.explain):
                    results.append(body(iteration, *resolve(args)))
        self.seconds[label] = time.perf_counter() - started
        return results
