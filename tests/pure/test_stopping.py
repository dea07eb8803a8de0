"""The stop request (S-STOP-1, S-STOP-3, S-STOP-4): a first signal asks the loop to stop
at the iteration end, a second one or the end of the grace stops at once; the time
limit is due from the first iteration end past it; the last line and exit status say
which; the grace is refused where it leaves no time to commit; an export is whole or
absent."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from checkpoint.export import write_aside
from configs.loading import ConfigError, load_config
from configs.schema import MIN_STOP_GRACE_S
from flows.stopping import EXIT_TIME_LIMIT, RESUME_IN_THE_UI, TIME_LIMIT, StopRequest, Stopped, stop_signals
from tests.conftest import TINY_PROFILE


def _until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_second_signal_or_the_end_of_the_grace_stops_at_once():
    hard: list[str] = []
    sigint_before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background
    sigterm_before = signal.getsignal(signal.SIGTERM)  # Ray's, after a test in this process started Ray
    stop = StopRequest(grace_s=60.0)
    stop.hard_stop = hard.append
    assert stop.due() is None
    with stop_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        _until(lambda: stop.due() is not None)  # the handler runs in the main thread between bytecodes
        assert stop.due() == "SIGTERM" and hard == []
        os.kill(os.getpid(), signal.SIGINT)
        _until(lambda: hard)
    stop.done()
    assert hard == ["a second SIGINT"]
    assert signal.getsignal(signal.SIGTERM) is sigterm_before  # the previous handler is back

    # A flow body leaves SIGTERM to its engine, which puts back what it found when the
    # flow run ends: between the body's end and the engine's, a SIGTERM is still a stop.
    with stop_signals(stop, in_a_flow=True):
        ours = signal.getsignal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is ours and signal.getsignal(signal.SIGINT) is sigint_before
    signal.signal(signal.SIGTERM, sigterm_before)

    graceful = StopRequest(grace_s=3.05)  # the hard stop fires SHUTDOWN_MARGIN_S before the grace ends
    graceful.hard_stop = hard.append
    graceful.request("SIGTERM")
    _until(lambda: len(hard) > 1)  # its timer fires after 0.05 s; a loaded machine may take longer
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


def test_a_sigint_stop_exits_130_and_a_run_with_nothing_to_keep_says_so():
    """S-STOP-4: each signal keeps its own status; a stop before the first iteration
    finished names no boundary; the Prefect UI's reader is told how to run it again there."""
    assert Stopped("SIGINT", 4, "/runs/a/checkpoints/iter_000004").exit_code() == 130
    early = Stopped("SIGTERM", 0, None)
    assert early.exit_code() == 143
    assert early.line() == (
        "stopped by SIGTERM before its first iteration finished: nothing to keep; "
        "run the same command again to start it"
    )
    in_the_ui = Stopped("SIGTERM", 9, "/runs/a/checkpoints/iter_000009").line(RESUME_IN_THE_UI)
    assert in_the_ui.endswith("run the deployment again with the same run name (or press Retry) to resume from it")


def test_the_grace_timer_ends_with_the_run_and_a_late_signal_stops_nothing():
    """S-STOP-4: a run that ended by itself is not turned into a hard stop by the timer
    of a signal that came during its last moments, nor by a signal after it ended."""
    hard: list[str] = []
    stop = StopRequest(grace_s=3.05)  # the timer would fire after 0.05 s
    stop.hard_stop = hard.append
    stop.request("SIGTERM")
    stop.done()
    time.sleep(0.3)
    stop.request("SIGTERM")
    assert hard == []


def test_a_grace_that_leaves_no_time_to_commit_is_refused_by_its_key():
    """S-STOP-4: at or below the shutdown margin every stop would be a hard stop."""
    for grace in ("3", "4.5", "0"):
        with pytest.raises(ConfigError) as refused:
            load_config(TINY_PROFILE, [f"job.stop_grace_seconds={grace}"])
        (problem,) = refused.value.problems
        assert problem.startswith(f"job.stop_grace_seconds: {grace}") and f"at least {MIN_STOP_GRACE_S:g}" in problem
    assert load_config(TINY_PROFILE, [f"job.stop_grace_seconds={MIN_STOP_GRACE_S:g}"]).job.stop_grace_seconds == 5


def test_an_export_is_written_aside_and_renamed_when_whole(tmp_path):
    """S-STOP-4: an export that stops half-way leaves nothing where the final model goes;
    the next one starts afresh and replaces an older export only once it is whole."""
    out = tmp_path / "final_model"

    def half_written(aside: str) -> dict[str, str]:
        (Path(aside) / "policy").mkdir(parents=True)
        (Path(aside) / "policy" / "model.safetensors").write_text("half")
        raise KeyboardInterrupt  # the process stops here

    with pytest.raises(KeyboardInterrupt):
        write_aside(str(out), half_written)
    assert not out.exists()

    def whole(text: str):
        def write(aside: str) -> dict[str, str]:
            assert not any(Path(aside).iterdir()) if Path(aside).exists() else True  # nothing of the half export
            (Path(aside) / "policy").mkdir(parents=True)
            (Path(aside) / "policy" / "model.safetensors").write_text(text)
            return {"policy": f"{aside}/policy"}
        return write

    assert write_aside(str(out), whole("first")) == {"policy": str(out / "policy")}
    assert write_aside(str(out), whole("second")) == {"policy": str(out / "policy")}
    assert (out / "policy" / "model.safetensors").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]


def test_a_clean_stop_leaves_no_engine_error_in_the_runs_log():
    """S-STOP-4: Prefect's engine logs the CancelledRun a stopped run's Cancelled state
    raises as an ERROR; that record alone is dropped."""
    import logging

    from prefect.exceptions import CancelledRun

    from compat.prefect_compat import ENGINE_ERROR, quiet_cancelled_run_error

    quiet_cancelled_run_error()
    kept: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = kept.append
    logger = logging.getLogger("prefect.flow_runs")
    logger.addHandler(handler)
    try:
        for error in (CancelledRun("stopped by SIGTERM after iteration 9"), RuntimeError("a real failure")):
            try:
                raise error
            except Exception:
                logger.error(ENGINE_ERROR, exc_info=True)
    finally:
        logger.removeHandler(handler)
    assert [type(record.exc_info[1]).__name__ for record in kept] == ["RuntimeError"]


HARD_STOP_AFTER_THE_COMMIT = """
import os, signal, time
from flows.stopping import StopRequest, stop_signals
stop = StopRequest(grace_s=3.2)
with stop_signals(stop):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    stop.stopped_at(7, "/runs/a/checkpoints/iter_000007")  # committed; the shutdown then hangs
    time.sleep(30)
"""


def _run_script(script: str):
    """`script` in a process of its own (its stop exits it), as it ended."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    return subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_the_grace_ending_after_the_commit_exits_with_the_stops_own_status_and_line():
    """S-STOP-4: a SIGINT stop whose shutdown outlives the grace still exits 130 with its
    stop line (it exited 143 "stopped at once"): the boundary was already committed."""
    ended = _run_script(HARD_STOP_AFTER_THE_COMMIT)
    assert ended.returncode == 130, ended.stderr
    assert ended.stderr.strip().splitlines()[-1] == (
        "stopped by SIGINT after iteration 7: committed /runs/a/checkpoints/iter_000007; "
        "run the same command again to resume from it"
    )


HARD_STOP_IN_AN_ITERATION = """
import os, signal, time
from flows.stopping import StopRequest, stop_signals
stop = StopRequest(grace_s=3.2)
stop.progress.kept(5, "/runs/a/checkpoints/iter_000005")
stop.progress.doing, stop.progress.iteration = "iteration 8", 8
stop.progress.stages.update({"train_policy[iter=8]": None, "train_critic[iter=8]": None})
with stop_signals(stop):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # the iteration never ends
"""


def test_a_stop_out_of_grace_names_what_still_ran_and_the_iterations_it_lost():
    """S-STOP-4: past the grace the last line says what was running and which iterations
    since the last boundary are lost, not only that the boundary stands."""
    ended = _run_script(HARD_STOP_IN_AN_ITERATION)
    assert ended.returncode == 143, ended.stderr
    assert ended.stderr.strip().splitlines()[-1] == (
        "stopped at once (the grace of 3.2 s ran out) during iteration 8 (train_policy[iter=8], train_critic[iter=8] "
        "still running): lost iterations 6-8, run since the last boundary; the last committed boundary "
        "/runs/a/checkpoints/iter_000005 stands; run the same command again to resume from it"
    )


def test_a_stop_out_of_grace_before_any_iteration_loses_nothing():
    from flows.stopping import Progress

    assert Progress().lost("a second SIGTERM") == (
        "stopped at once (a second SIGTERM) during the start-up: lost nothing; nothing was committed yet; "
        "run the same command again to resume from it"
    )
    restoring = Progress(doing="the restore of /r/iter_000004", committed=4, boundary="/r/iter_000004")
    assert restoring.lost("the grace of 30 s ran out").startswith(
        "stopped at once (the grace of 30 s ran out) during the restore of /r/iter_000004: lost nothing; "
        "the last committed boundary /r/iter_000004 stands"
    )
    one = Progress(doing="iteration 5", iteration=5, committed=4, boundary="/r/iter_000004")
    assert "lost iteration 5, run since the last boundary" in one.lost("x")
