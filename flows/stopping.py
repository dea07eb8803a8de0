"""Stopping a run without losing work (S-STOP): a stop is requested by SIGTERM or SIGINT
(preemption, Ctrl-C, Cancel in the Prefect UI) or by the run's time limit, and the
iteration loop honours it at the end of the iteration it is in, committing that
iteration. The grace bounds how long that may take; past it, or at a second signal,
the process stops at once and the previous boundary stands (docs/stopping.md)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from configs.schema import PPOConfig

TIME_LIMIT = "time limit"
EXIT_TIME_LIMIT = 3  # stopped at job.time_limit_minutes, committed: resumable
SHUTDOWN_MARGIN_S = 3.0  # of the grace, kept for releasing the actors and exiting


@dataclass(frozen=True)
class Stopped:
    """How a run stopped before its last iteration: why, after which iteration, and the
    boundary that iteration committed (None when the run writes no boundaries)."""

    reason: str
    iteration: int
    boundary: str | None

    def exit_code(self) -> int:
        if self.reason == TIME_LIMIT:
            return EXIT_TIME_LIMIT
        return 128 + int(signal.Signals[self.reason])  # the shell's convention for a signal

    def line(self) -> str:
        why = "at its time limit (job.time_limit_minutes)" if self.reason == TIME_LIMIT else f"by {self.reason}"
        at = f"committed {self.boundary}" if self.boundary else "nothing committed (the run writes no boundaries)"
        return f"stopped {why} after iteration {self.iteration}: {at}; run the same command again to resume from it"


class StopRequest:
    """One per launch. `due()` is asked at every iteration end; `hard_stop` is what a
    second signal or the end of the grace runs (set by whoever holds the actors)."""

    def __init__(self, grace_s: float = 30.0, time_limit_s: float | None = None) -> None:
        self.grace_s = grace_s
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.reason: str | None = None
        self.outcome: Stopped | None = None  # set by the iteration loop once it stopped
        self.hard_stop: Callable[[str], None] = exit_now
        self._timer: threading.Timer | None = None

    def due(self) -> str | None:
        if self.reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
            return TIME_LIMIT
        return self.reason

    def request(self, reason: str) -> None:
        if self.reason is not None:  # a second signal: at once
            self.hard_stop(f"a second {reason}")
            return
        self.reason = reason
        print(f"stop: {reason} received; finishing the current iteration and committing it "
              f"(within job.stop_grace_seconds={self.grace_s:g}; send it again to stop at once)",
              file=sys.stderr, flush=True)
        self._timer = threading.Timer(max(0.0, self.grace_s - SHUTDOWN_MARGIN_S), self.hard_stop,
                                      args=(f"the grace of {self.grace_s:g} s ran out",))
        self._timer.daemon = True
        self._timer.start()

    def done(self) -> None:
        """The stop was honoured (or the run ended): no hard stop any more."""
        if self._timer is not None:
            self._timer.cancel()


def stop_request(config: PPOConfig) -> StopRequest:
    """The run's stop request, its time limit counted from now (the launch)."""
    limit = config.job.time_limit_minutes
    return StopRequest(config.job.stop_grace_seconds, None if limit is None else limit * 60.0)


def exit_now(why: str) -> None:
    import os

    print(f"stopped at once ({why}): the last committed boundary stands; run the same command again to "
          "resume from it", file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGTERM)


@contextlib.contextmanager
def stop_signals(stop: StopRequest | None) -> Iterator[None]:
    """SIGTERM and SIGINT request `stop` while inside (main thread only: elsewhere Python
    cannot install handlers); the previous handlers come back afterwards. The flow
    enters this in its body and again in each block's, because Prefect's flow engine
    installs its own SIGTERM handler, which would crash the run, at every flow start."""
    if stop is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        stop.request(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)
