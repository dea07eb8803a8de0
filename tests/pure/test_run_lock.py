"""One writer per run directory (issue 16 item 6, S-FAULT-4): a second launch of a
live run is refused naming the first; a dead run's lock is taken over, so a rerun
after a crash (or Retry) just works."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rundir.run_lock import LOCK_NAME, RunLock, RunLocked, check_run_lock


def _holder_file(run_dir, pid: int, process_start: str, host: str | None = None, heartbeat: float | None = None,
                 **more):
    now = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_NAME).write_text(json.dumps({
        "host": host or socket.gethostname(), "pid": pid, "process_start": process_start,
        "flow_run": "other-run (1234)",
        "acquired_at": now, "heartbeat_at": heartbeat if heartbeat is not None else now, "token": "theirs", **more,
    }))


def _start_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[19]


def test_a_live_holder_refuses_a_second_writer_naming_it(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder_file(tmp_path, sleeper.pid, _start_of(sleeper.pid))
        with pytest.raises(RunLocked, match=rf"pid {sleeper.pid}, flow run other-run \(1234\)"):
            RunLock(tmp_path).acquire()
        with pytest.raises(RunLocked, match=f"host {socket.gethostname()}"):
            check_run_lock(tmp_path)
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == sleeper.pid  # left as it was
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_dead_holders_lock_is_taken_over(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _holder_file(tmp_path, int(finished.stdout), "12345")
    check_run_lock(tmp_path)  # no refusal
    with RunLock(tmp_path, "mine") as lock:
        assert lock.took_over is not None and lock.took_over.pid == int(finished.stdout)
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["pid"] == os.getpid() and held["flow_run"] == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # released, no stale copies left


def test_a_reused_pid_is_not_the_holder(tmp_path):
    _holder_file(tmp_path, os.getpid(), "not-this-process-start")  # our pid, another process's start time
    with RunLock(tmp_path) as lock:
        assert lock.took_over is not None


def test_another_hosts_lock_lives_while_its_heartbeat_is_fresh(tmp_path):
    _holder_file(tmp_path, 1, "1", host="node-b", heartbeat=time.time())
    with pytest.raises(RunLocked, match="host node-b"):
        RunLock(tmp_path, stale_after_s=60).acquire()
    _holder_file(tmp_path, 1, "1", host="node-b", heartbeat=time.time() - 120)
    with RunLock(tmp_path, stale_after_s=60) as lock:
        assert lock.took_over.host == "node-b"


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    lock = RunLock(tmp_path).acquire()
    lock.renew()
    _holder_file(tmp_path, 1, "1", host="node-b")  # taken over meanwhile (we looked dead from there)
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "node-b"


def test_a_stopped_run_still_closing_is_waited_for_then_the_lock_is_taken(tmp_path, capsys):
    """A rerun pressed as soon as the UI shows Cancelled: the stopped run (S-STOP-2)
    marked its lock closing; the launch waits for it to let go instead of refusing."""
    import threading

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder_file(tmp_path, sleeper.pid, _start_of(sleeper.pid), closing=True)
        threading.Timer(1.0, (tmp_path / LOCK_NAME).unlink).start()
        started = time.monotonic()
        with RunLock(tmp_path, "mine") as lock:
            assert time.monotonic() - started >= 1.0 and lock.took_over is None
            assert json.loads((tmp_path / LOCK_NAME).read_text())["flow_run"] == "mine"
        assert f"the stopped run host {socket.gethostname()}, pid {sleeper.pid}" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_closing_run_that_does_not_let_go_is_refused_after_the_wait(tmp_path, monkeypatch):
    from rundir import run_lock

    monkeypatch.setattr(run_lock, "CLOSING_WAIT_S", 0.5)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder_file(tmp_path, sleeper.pid, _start_of(sleeper.pid), closing=True)
        with pytest.raises(RunLocked, match=rf"pid {sleeper.pid}, flow run other-run \(1234\)"):
            RunLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_closing_keeps_the_lock_ours_and_marks_it(tmp_path):
    with RunLock(tmp_path, "mine") as lock:
        lock.closing()
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["closing"] is True and held["token"] == lock.holder.token
    assert not (tmp_path / LOCK_NAME).exists()
