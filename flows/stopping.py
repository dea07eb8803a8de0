"""Stopping a run without losing work (S-STOP): a stop is requested by SIGTERM or SIGINT
(preemption, Ctrl-C, Cancel in the Prefect UI) or by the run's time limit, and the
iteration loop honours it at the end of the iteration it is in, committing that
iteration, the last one included. A signal is also honoured outside the iterations
(start-up, restore, export) with the same outcome (S-STOP-4). The grace bounds how long
that may take; past it, or at a second signal, the process stops at once and the
previous boundary stands (docs/stopping.md)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from configs.schema import STOP_SHUTDOWN_MARGIN_S as SHUTDOWN_MARGIN_S, PPOConfig

TIME_LIMIT = "time limit"
EXIT_TIME_LIMIT = 3  # stopped at job.time_limit_minutes, committed: resumable
RESUME_BY_COMMAND = "run the same command again"
RESUME_IN_THE_UI = "run the deployment again with the same run name (or press Retry)"


@dataclass(frozen=True)
class Stopped:
    """How a run stopped: why, the last iteration it has committed (0: none yet) and
    that iteration's boundary (None when there is none)."""

    reason: str
    iteration: int
    boundary: str | None

    def exit_code(self) -> int:
        if self.reason == TIME_LIMIT:
            return EXIT_TIME_LIMIT
        return signal_exit_code(self.reason)

    def line(self, resume: str = RESUME_BY_COMMAND) -> str:
        """The run's last line; `resume` says how to run it again where it is read (the
        Prefect UI has no command to repeat)."""
        why = "at its time limit (job.time_limit_minutes)" if self.reason == TIME_LIMIT else f"by {self.reason}"
        if self.boundary:
            return (f"stopped {why} after iteration {self.iteration}: committed {self.boundary}; "
                    f"{resume} to resume from it")
        if self.iteration == 0:
            return f"stopped {why} before its first iteration finished: nothing to keep; {resume} to start it"
        return (f"stopped {why} after iteration {self.iteration}: nothing committed (the run writes no boundaries); "
                f"{resume} to start it again")


class StopSignalled(Exception):
    """A signal asked the run to stop outside its iterations (start-up, restore):
    raised by `StopRequest.check` and caught once, by the attempt, which keeps the
    boundary it resumed from (S-STOP-4)."""


def signal_exit_code(name: str) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number."""
    return 128 + int(signal.Signals[name])


@dataclass
class Progress:
    """Where the run is, for the last line of a stop that ran out of grace: what it
    was doing, the iteration in progress, the stages still running (the runner's
    live set) and the last boundary committed (S-STOP-4)."""

    doing: str = "the start-up"
    iteration: int | None = None
    committed: int = 0
    boundary: str | None = None
    stages: dict[str, None] = field(default_factory=dict)

    def kept(self, iteration: int, boundary: str | None) -> None:
        self.committed, self.boundary = iteration, boundary

    def lost(self, why: str, resume: str = RESUME_BY_COMMAND) -> str:
        """The hard stop's line: what was still running and what is lost with it."""
        running = self.doing + (f" ({', '.join(self.stages)} still running)" if self.stages else "")
        stands = f"the last committed boundary {self.boundary} stands" if self.boundary else "nothing was committed yet"
        if self.iteration is not None and self.iteration > self.committed:
            first = self.committed + 1
            span = f"iteration {first}" if first == self.iteration else f"iterations {first}-{self.iteration}"
            lost = f"lost {span}, run since the last boundary"
        else:
            lost = "lost nothing"
        return f"stopped at once ({why}) during {running}: {lost}; {stands}; {resume} to resume from it"


class StopRequest:
    """One per launch. `due()` is asked at every iteration end and at every step of the
    start-up and the close; `hard_stop` is what a second signal or the end of the grace
    runs (set by whoever holds the actors)."""

    def __init__(self, grace_s: float = 30.0, time_limit_s: float | None = None) -> None:
        self.grace_s = grace_s
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.reason: str | None = None
        self.outcome: Stopped | None = None  # set once the run has stopped and kept what it could
        self.hard_stop: Callable[[str], None] = self.exit_now
        self.progress = Progress()  # kept up to date by the run, read by the hard stop
        self._timer: threading.Timer | None = None
        self._ended = False

    def due(self) -> str | None:
        if self.reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
            return TIME_LIMIT
        return self.reason

    def signalled(self) -> str | None:
        """A signal's stop, honoured in any phase; the time limit is due only at an
        iteration end (S-STOP-3), so a run past it still makes progress each time."""
        return self.reason

    def check(self) -> None:
        """The one stop check of the start-up and the restore: raises StopSignalled."""
        if self.reason is not None:
            raise StopSignalled(self.reason)

    def request(self, reason: str) -> None:
        if self._ended:  # the run has ended by itself: nothing left to stop
            return
        if self.reason is not None:  # a second signal: at once
            self.hard_stop(f"a second {reason}")
            return
        self.reason = reason
        print(f"stop: {reason} received; stopping with the last finished iteration committed (an iteration in "
              f"progress is finished first), within job.stop_grace_seconds={self.grace_s:g}; send it again to stop "
              "at once",
              file=sys.stderr, flush=True)
        self._timer = threading.Timer(max(0.0, self.grace_s - SHUTDOWN_MARGIN_S), self._grace_ran_out)
        self._timer.daemon = True
        self._timer.start()

    def _grace_ran_out(self) -> None:
        if not self._ended:
            self.hard_stop(f"the grace of {self.grace_s:g} s ran out")

    def stopped_at(self, iteration: int, boundary: str | None) -> Stopped:
        """Record that the run stopped for the due reason, keeping `iteration`."""
        reason = self.due()
        assert reason is not None, "stopped_at without a stop request"
        self.outcome = Stopped(reason, iteration, boundary)
        return self.outcome

    def done(self) -> None:
        """The run has ended (stopped or by itself): no hard stop any more, and a signal
        from now on has nothing to stop (S-STOP-4: the grace timer ends with the run)."""
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()

    def exit_now(self, why: str) -> None:
        """The hard stop of a process that holds no actors: the stop's own status (130
        for SIGINT), or the stopped run's when it had already stopped and committed."""
        if self.outcome is not None:
            print(self.outcome.line(), file=sys.stderr, flush=True)
            os._exit(self.outcome.exit_code())
        print(self.progress.lost(why), file=sys.stderr, flush=True)
        os._exit(signal_exit_code(self.reason) if self.reason and self.reason != TIME_LIMIT else 128 + signal.SIGTERM)


def stop_request(config: PPOConfig) -> StopRequest:
    """The run's stop request, its time limit counted from now (the launch)."""
    limit = config.job.time_limit_minutes
    return StopRequest(config.job.stop_grace_seconds, None if limit is None else limit * 60.0)


@contextlib.contextmanager
def stop_signals(stop: StopRequest | None, *, in_a_flow: bool = False) -> Iterator[None]:
    """SIGTERM and SIGINT request `stop` while inside (main thread only: elsewhere Python
    cannot install handlers); the previous handlers come back afterwards. In a flow's
    body (`in_a_flow`) SIGTERM is left as it is at the end: the flow's engine installed
    its own SIGTERM handler (which would crash the run) at the flow run's start and puts
    back what it found at its end, so no SIGTERM in between falls to it (S-STOP-4)."""
    if stop is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = _install(stop, (signal.SIGTERM, signal.SIGINT))
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            if not (in_a_flow and signum == signal.SIGTERM):
                signal.signal(signum, handler_before)


def take_sigterm_back(stop: StopRequest | None) -> None:
    """Inside `stop_signals`, after Ray connected this process: Ray's driver installs its
    own SIGTERM handler (a stack dump, then abort) below Python's when it connects, so a
    stop while the actors start would kill the run instead (S-STOP-4, S-STOP-5)."""
    if stop is not None and threading.current_thread() is threading.main_thread():
        _install(stop, (signal.SIGTERM,))


def _install(stop: StopRequest, signals: tuple[signal.Signals, ...]) -> dict[int, object]:
    def handler(signum: int, frame: object) -> None:
        stop.request(signal.Signals(signum).name)

    return {signum: signal.signal(signum, handler) for signum in signals}
