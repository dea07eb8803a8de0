"""Role processes forked from one preloaded process (processes/fork_server.py, issue 19).

What a user relies on: a forked actor is an ordinary Ray worker (the raylet's
environment, the run's settings, a failure named as before), it imports nothing
heavy itself, and nothing it started outlives the run, even when the driver is
killed. The fault, resume and equality tests of this suite all run on forked actors
too (the session's Ray is a local one).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO_ROOT


def _probe_class():
    import ray

    @ray.remote(num_cpus=0, max_restarts=0)
    class Probe:
        def facts(self) -> dict:
            import sys

            return {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "pgid": os.getpgid(0),
                "job": os.environ.get("RAY_JOB_ID"),
                "threads": os.environ.get("OMP_NUM_THREADS"),
                "token_set": bool(os.environ.get("RAY_AUTH_TOKEN")),
                "socket_env": os.environ.get("PPO_FORK_SERVER_SOCKET"),
                "transformers_preloaded": "transformers.modeling_utils" in sys.modules,
                "runtime_env": ray.get_runtime_context().runtime_env,
                "pythonpath": os.environ.get("PYTHONPATH", ""),
            }

    return Probe


def test_a_local_runs_actors_are_forked_workers_with_the_raylets_environment(ray_cluster):
    import ray

    server = ray_cluster.fork_server
    assert server is not None, "the session's local Ray should fork its workers (PPO_FORK_WORKERS unset)"
    probe = _probe_class().remote()
    facts = ray.get(probe.facts.remote(), timeout=120)
    assert facts["ppid"] == server.process.pid  # forked by the server, not started by the raylet
    # Its own process group, as a worker the raylet starts has: the raylet ends a worker
    # by signalling its group, which must not be the server's (all forked workers).
    assert facts["pgid"] == facts["pid"]
    assert facts["job"], "the child must run with the environment the raylet gave its worker"
    assert facts["threads"] == "1" and facts["token_set"]
    assert facts["socket_env"] == server.socket_path
    assert facts["transformers_preloaded"]  # imported once in the server, not in the actor
    # The run's settings came from the raylet's environment, not a runtime environment:
    # with one, Ray starts every worker through its setup_worker.py shim first.
    assert facts["runtime_env"] == {}
    assert str(REPO_ROOT) in facts["pythonpath"].split(os.pathsep)
    # Only this user may ask the server for a process.
    assert stat.S_IMODE(os.stat(server.directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server.socket_path).st_mode) == 0o600
    ray.kill(probe)


def test_a_killed_forked_actor_fails_its_calls_and_leaves_no_process(ray_cluster):
    import ray
    from ray.exceptions import ActorDiedError

    probe = _probe_class().remote()
    pid = ray.get(probe.facts.remote(), timeout=120)["pid"]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        ray.get(probe.facts.remote(), timeout=60)
    assert not _alive(pid)


def test_ending_one_forked_actor_leaves_the_others_and_the_server_alive(ray_cluster):
    """ray.kill ends a worker through its process group; a run kills some actors (a
    trainer's ranks) while a driver keeps others (tests/support/process_pool.py)."""
    import ray

    server = ray_cluster.fork_server
    ended, kept = _probe_class().remote(), _probe_class().remote()
    ended_facts = ray.get(ended.facts.remote(), timeout=120)
    ended_pid, ended_group = ended_facts["pid"], ended_facts["pgid"]
    ray.get(kept.facts.remote(), timeout=120)
    ray.kill(ended)
    _wait_for(lambda: not _alive(ended_pid), 30, f"the ended actor's process {ended_pid} outlived ray.kill by 30 s")
    # The raylet follows its first signal with a kill of the worker's process group
    # once the worker has exited (Ray 2.60: SIGKILL, if the group has processes left).
    # Wait until that group is empty: only then can the group kill reach no one. A
    # worker in the server's group leaves it non-empty until that kill has ended the
    # server and every forked worker, which the checks below then find.
    _wait_for(
        lambda: not _group_members(ended_group), 30,
        lambda: f"process group {ended_group} of the ended actor still holds {_group_members(ended_group)} "
        f"30 s after its process ended (server {server.process.pid}): the raylet's group kill would end them",
    )
    assert ray.get(kept.facts.remote(), timeout=60)["pid"] != ended_pid
    assert server.process.poll() is None
    ray.kill(kept)


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from cli.environment import apply_default_environment
    apply_default_environment()
    import ray
    from processes import ray_session
    session = ray_session.init_ray(num_cpus=1)

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self):
            return os.getpid()

    probe = Probe.remote()
    print(session.fork_server.process.pid, ray.get(probe.pid.remote()), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.slow  # 12 s: a driver of its own; test_group_stop.py (slow) kills whole runs the same way
def test_a_killed_driver_leaves_neither_the_fork_server_nor_its_workers():
    """S-FAULT-2: killing the whole run at any moment must not leave processes behind
    that hold memory (the kill-point tests check the rerun; this checks the leftovers)."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(REPO_ROOT)], stdout=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")},
    )
    try:
        server_pid, actor_pid = map(int, driver.stdout.readline().split())
        assert _alive(server_pid) and _alive(actor_pid)
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 30
    while (_alive(server_pid) or _alive(actor_pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(server_pid), "the fork server outlived its driver"
    assert not _alive(actor_pid), "a forked worker outlived its driver"


def test_without_a_reachable_server_a_worker_starts_as_ray_starts_it(tmp_path):
    """The client falls back to an ordinary `python default_worker.py ...` start: a
    stopped or crashed server costs start-up time, never a run."""
    from compat.ray_compat import WORKER_SCRIPT

    marker = tmp_path / "argv.txt"
    script = tmp_path / WORKER_SCRIPT  # the name of Ray's worker script: a command the client forks
    script.write_text(f"import sys; open({str(marker)!r}, 'w').write(' '.join(sys.argv[1:]))\n")
    client = REPO_ROOT / "processes" / "fork_client.py"
    env = {**os.environ, "PPO_FORK_SERVER_SOCKET": str(tmp_path / "no-such.sock"),
           "PPO_FORK_WORKER_SCRIPT": WORKER_SCRIPT}
    done = subprocess.run([sys.executable, "-S", str(client), str(script), "--flag=1"], env=env, timeout=60)
    assert done.returncode == 0
    assert marker.read_text() == "--flag=1"


def test_the_launcher_runs_any_command_but_a_workers_as_plain_python(ray_cluster):
    """A local Ray starts all its Python daemons with the launcher it uses for workers
    (processes/fork_launch.py): those must run unchanged, with site-packages, in the very
    process the raylet started, not as a fork."""
    server = ray_cluster.fork_server
    process = subprocess.Popen(
        [server.launcher, "-u", "-c", "import os, sys; print(os.getpid(), sys.flags.no_site, sys.argv[1:])", "x"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PPO_FORK_SERVER_SOCKET": server.socket_path},
    )
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert out.split(maxsplit=2) == [str(process.pid), "0", "['x']\n"]


def _wait_for(condition, timeout_s: float, message) -> None:
    """Poll `condition` every 0.05 s; fail with `message` (or what it returns) when it
    has not held within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(message() if callable(message) else message)
        time.sleep(0.05)


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes in process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members
