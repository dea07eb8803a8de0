"""The stop request (S-STOP-1, S-STOP-3): a first signal asks the loop to stop at the
iteration end, a second one or the end of the grace stops at once; the time limit is
due from the first iteration end past it; the last line and exit status say which."""

from __future__ import annotations

import os
import signal
import time

from flows.stopping import EXIT_TIME_LIMIT, TIME_LIMIT, StopRequest, Stopped, stop_signals


def test_a_second_signal_or_the_end_of_the_grace_stops_at_once():
    hard: list[str] = []
    stop = StopRequest(grace_s=60.0)
    stop.hard_stop = hard.append
    assert stop.due() is None
    with stop_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs in the main thread between bytecodes
        assert stop.due() == "SIGTERM" and hard == []
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    stop.done()
    assert hard == ["a second SIGINT"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the previous handler is back

    graceful = StopRequest(grace_s=3.05)  # the hard stop fires SHUTDOWN_MARGIN_S before the grace ends
    graceful.hard_stop = hard.append
    graceful.request("SIGTERM")
    time.sleep(0.3)
    assert hard[-1] == "the grace of 3.05 s ran out"


def test_the_time_limit_is_due_once_passed_and_each_stop_has_its_line_and_status():
    assert StopRequest(time_limit_s=3600).due() is None
    assert StopRequest(time_limit_s=0.0).due() == TIME_LIMIT
    limit = Stopped(TIME_LIMIT, 7, "/runs/a/checkpoints/iter_000007")
    assert limit.exit_code() == EXIT_TIME_LIMIT and "time limit" in limit.line() and "iter_000007" in limit.line()
    preempted = Stopped("SIGTERM", 12, "/runs/a/checkpoints/iter_000012")
    assert preempted.exit_code() == 143
    assert preempted.line() == (
        "stopped by SIGTERM after iteration 12: committed /runs/a/checkpoints/iter_000012; "
        "run the same command again to resume from it"
    )
