"""A deployment's run says why it ended, and the commands after `make serve` find its
stack (S-BYO-2, S-TEAM-1): the lines a failed run ends on (flows/failures.py), what
`make watch` prints at a run's end (deployments/watch.py), and where `make deploy`,
`make watch` and `make stop` look for the stack (deployments/serve_record.py). No
server is started here; tests/services/test_deployment.py (-m slow) does it for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs.loading import ConfigError
from deployments import serve_record
from deployments.serve_record import NoStack
from deployments.watch import LogLine, ending, shown
from flows.failures import REPEATS_HINT, StageFailed, failure_lines
from rundir.run_lock import RunLocked

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- the lines a failed run ends on ---------------------------------------------------


def test_a_config_refusal_ends_on_one_error_line_per_problem():
    error = ConfigError(["rl.data.path: no such file", "rl.max_steps: must be at least 1"])
    assert failure_lines(error, "resume") == ["error: rl.data.path: no such file",
                                              "error: rl.max_steps: must be at least 1"]


def test_a_failed_stage_ends_on_its_name_and_what_to_do():
    fault = StageFailed("rollout[iter=2] failed: ActorDiedError: the rollout actor died")
    assert failure_lines(fault, "press Retry") == [f"error: {fault}", "  press Retry"]
    repeats = StageFailed("reward[iter=1] failed: KeyError: 'answer'", repeats=True)
    assert failure_lines(repeats, "press Retry") == [f"error: {repeats}", f"  {REPEATS_HINT}"]


def test_a_refusal_of_the_runs_own_state_is_its_message_and_an_unknown_error_is_left_to_its_traceback():
    assert failure_lines(RunLocked("run 'x' is already running (pid 7)"), "r") == [
        "error: run 'x' is already running (pid 7)"]
    assert failure_lines(ZeroDivisionError("division by zero"), "r") is None


# -- what `make watch` ends on ---------------------------------------------------------

ENGINE = "Flow run encountered an exception: "


def test_a_failed_run_ends_on_the_error_lines_it_logged_not_on_prefects_wrapper():
    logs = [LogLine(20, "prefect: flow run try1 started"),
            LogLine(40, "error: rl.data.path: [Errno 2] No such file or directory: '/x.jsonl'"),
            LogLine(40, "Encountered exception during execution: ConfigError(...)\nTraceback (most recent call last):\n"
                        "  File x\nconfigs.loading.ConfigError: invalid config")]
    lines, code = ending("FAILED", "Failed", ENGINE + "ConfigError: invalid config:\n  - rl.data.path: ...", logs)
    assert code == 1
    assert lines == ["Failed:", "error: rl.data.path: [Errno 2] No such file or directory: '/x.jsonl'"]


def test_a_run_that_logged_no_error_line_ends_on_its_state_message_and_the_last_error_logs():
    logs = [LogLine(40, "Engine execution exited with unexpected exception\nTraceback (most recent call last):\n"
                        "  File y\nMemoryError: out of memory")]
    lines, code = ending("CRASHED", "Crashed", "Flow run infrastructure exited with non-zero status code -9.", logs)
    assert code == 1
    assert lines == ["Crashed:", "error: Flow run infrastructure exited with non-zero status code -9.",
                     "  log: MemoryError: out of memory"]
    lines, _ = ending("FAILED", "Failed", ENGINE + "RuntimeError: boom", [])
    assert lines == ["Failed:", "error: RuntimeError: boom"]


def test_a_completed_run_ends_on_its_message_and_exits_0():
    assert ending("COMPLETED", "Completed", "run 'x' is complete: iteration 1 of 1", []) == (
        ["done: Completed: run 'x' is complete: iteration 1 of 1"], 0)
    assert ending("CANCELLED", "Cancelled", "stopped by the UI", [])[1] == 1


def test_a_traceback_is_shown_as_its_first_and_last_lines():
    message = "Encountered exception\nTraceback (most recent call last):\n  File a\nValueError: bad row 3"
    assert shown(message) == "Encountered exception\n    ... ValueError: bad row 3"
    assert shown("error: a\n  press Retry") == "error: a\n  press Retry"


# -- finding the stack `make serve` started ---------------------------------------------


def _stack(state_dir: Path, pid: int) -> Path:
    state_dir.mkdir(parents=True)
    (state_dir / "env.sh").write_text("export PREFECT_API_URL=http://127.0.0.1:4999/api\n")
    (state_dir / "server.pid").write_text(f"{pid}\n")
    return state_dir


def _dead_pid() -> int:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    return finished.pid


def test_the_recorded_stack_is_found_without_the_state_dir_and_a_given_one_wins(tmp_path):
    record = tmp_path / "serve.json"
    served = _stack(tmp_path / "elsewhere", os.getpid())
    serve_record.write(record, served, "http://127.0.0.1:4999/api")
    environ = {serve_record.RECORD_ENV: str(record)}
    found = serve_record.running(serve_record.find(environ))
    assert found.env_file == served.resolve() / "env.sh" and found.api_url == "http://127.0.0.1:4999/api"
    given = tmp_path / "given"
    assert serve_record.find({**environ, serve_record.STATE_DIR_ENV: str(given)}).state_dir == given
    nothing = {serve_record.RECORD_ENV: str(tmp_path / "none.json")}
    assert serve_record.find(nothing).state_dir == serve_record.DEFAULT_STATE_DIR


def test_no_stack_and_a_stopped_stack_are_told_apart(tmp_path):
    with pytest.raises(NoStack, match=r"no local Prefect stack at .*/empty \(PPO_PREFECT_STATE_DIR\): run make serve"):
        serve_record.running(serve_record.find({serve_record.STATE_DIR_ENV: str(tmp_path / "empty")}))
    record = tmp_path / "serve.json"
    serve_record.write(record, _stack(tmp_path / "stopped", _dead_pid()), "http://127.0.0.1:4999/api")
    with pytest.raises(NoStack) as stopped:
        serve_record.running(serve_record.find({serve_record.RECORD_ENV: str(record)}))
    assert f"recorded in {record}" in str(stopped.value) and "is not running: run make serve" in str(stopped.value)
    record.write_text("{not json")
    with pytest.raises(NoStack, match="not a record of `make serve`"):
        serve_record.find({serve_record.RECORD_ENV: str(record)})


def test_the_command_make_deploy_runs_prints_the_env_file_or_why_not(tmp_path):
    record = tmp_path / "serve.json"
    served = _stack(tmp_path / "stack", os.getpid())
    serve_record.write(record, served, "http://127.0.0.1:4999/api")
    env = {key: value for key, value in os.environ.items() if key != serve_record.STATE_DIR_ENV}

    def env_file(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "deployments.serve_record", "env-file"], cwd=REPO_ROOT,
                              env={**env, **extra}, capture_output=True, text=True, timeout=60)

    found = env_file(PPO_PREFECT_SERVE_RECORD=str(record))
    assert found.returncode == 0 and found.stdout.strip() == str(served.resolve() / "env.sh"), found.stderr
    missing = env_file(PPO_PREFECT_SERVE_RECORD=str(record), PPO_PREFECT_STATE_DIR=str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "run make serve first" in missing.stderr
