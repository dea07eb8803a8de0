"""What a run's local Ray started, and only that, is ended after it (S-STOP-5): found by
the mark in their environment whoever their parent is by then, waited for, then killed;
a process without the mark is untouched, and a process that ended is never signalled
again."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from processes.process_tree import MARK_ENV, alive, end_processes, marked, terminate, with_environment

# A parent that starts a grandchild and lingers, as Ray's agents outlive their raylet.
TREE = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "time.sleep(60)"
)


def test_the_marked_processes_are_ended_and_nothing_else_is_touched():
    mark = f"test-{os.getpid()}-{time.monotonic_ns()}"
    started = subprocess.Popen([sys.executable, "-c", TREE], env={**os.environ, MARK_ENV: mark})
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while len(marked(mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = marked(mark)
        assert {pid for pid, _ in found} >= {started.pid} and len(found) == 2
        assert end_processes(found, wait_s=0.2) == found  # they did not end by themselves
        started.wait(timeout=5)
        deadline = time.monotonic() + 5
        while alive(found) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(found) == set() and marked(mark) == set()
        assert bystander.poll() is None
        assert end_processes(found, wait_s=0.0) == set()  # gone: nothing is signalled
    finally:
        bystander.kill()
        started.kill()


def test_terminate_asks_first_and_kills_only_what_stays():
    """SIGTERM ends a process that heeds it (nothing had to be killed); one that ignores
    it is killed when the wait is over."""
    entry = f"PPO_TEST_TERMINATE=test-{os.getpid()}-{time.monotonic_ns()}"
    key, value = entry.split("=")
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    heeding = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, key: value})
    ignoring = subprocess.Popen(
        [sys.executable, "-c", stubborn], env={**os.environ, key: value}, stdout=subprocess.PIPE
    )
    try:
        ignoring.stdout.readline()  # its handler is in place
        deadline = time.monotonic() + 10
        while len(with_environment(entry)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = with_environment(entry)
        assert {pid for pid, _ in found} == {heeding.pid, ignoring.pid}
        killed = terminate(found, wait_s=1.0)
        assert {pid for pid, _ in killed} == {ignoring.pid}
        assert heeding.wait(timeout=5) == -15 and ignoring.wait(timeout=5) == -9
    finally:
        heeding.kill()
        ignoring.kill()
