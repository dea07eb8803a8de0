"""What a run started, and only that, is ended after it (S-STOP-5): a tree of processes
found by pid and start time through /proc, waited for, then killed; a process outside
the tree is untouched, and a process that ended is never signalled again."""

from __future__ import annotations

import subprocess
import sys
import time

from processes.process_tree import alive, children, end_processes, with_descendants

# A parent that starts a grandchild and lingers, as Ray's agents outlive their raylet.
TREE = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "time.sleep(60)"
)


def test_a_started_tree_is_ended_and_nothing_else_is_touched():
    before = children()
    started = subprocess.Popen([sys.executable, "-c", TREE])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        roots = {child for child in children() - before if child[0] == started.pid}
        deadline = time.monotonic() + 10
        while len(with_descendants(roots)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = with_descendants(roots)
        assert len(tree) == 2
        killed = end_processes(tree, wait_s=0.2)
        assert killed == tree
        started.wait(timeout=5)
        deadline = time.monotonic() + 5
        while alive(tree) and time.monotonic() < deadline:  # the grandchild is reaped by init
            time.sleep(0.05)
        assert alive(tree) == set()
        assert bystander.poll() is None
        assert end_processes(tree, wait_s=0.0) == set()  # gone: nothing is signalled
    finally:
        bystander.kill()
        started.kill()
