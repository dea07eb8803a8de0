"""A run on a Ray cluster it did not start (S-TEAM-2), on loopback: a head with token
auth and two CPUs that the test starts with `ray start --head --block`, the join
script (deployments/kubernetes/join-ray-then.sh) as the flow's zero-capacity node,
the CPU profile through it. Every role must land on the head, none on the flow's node;
the head must outlive the run; everything is stopped by pid afterwards.

The script's own refusals that need no cluster run in the default suite; the rest
start a head and are `-m slow`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TINY_PROFILE

JOIN_SCRIPT = REPO_ROOT / "deployments" / "kubernetes" / "join-ray-then.sh"
LIST_NODES = r"""
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print("NODES " + json.dumps([[n["NodeID"], n["Alive"], n["Resources"].get("CPU", 0)] for n in ray.nodes()]))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the session's Ray or Prefect API: the joined
    run must hold only the cluster's token, as a pod would."""
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith(("RAY_AUTH", "RAY_ADDRESS", "PPO_FORK", "PREFECT_API", "PPO_RAY_NODE"))
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(PPO_PYTHON=sys.executable, RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


def _join(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(JOIN_SCRIPT), *command], env=env, cwd=REPO_ROOT, text=True, capture_output=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "env, named",
    [
        ({}, r"RAY_ADDRESS is not set"),
        ({"RAY_ADDRESS": "auto", "RAY_AUTH_TOKEN": "x"}, r"RAY_ADDRESS=auto: .*never guesses"),
        ({"RAY_ADDRESS": "10.0.0.1:6379"}, r"no Ray token: set RAY_AUTH_TOKEN .* or RAY_AUTH_TOKEN_PATH"),
        ({"RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_TOKEN_PATH": "/nonexistent"}, r"RAY_AUTH_TOKEN_PATH=/nonexistent"),
        ({"RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_TOKEN": "x", "RAY_AUTH_MODE": "disabled"}, r"RAY_AUTH_MODE="),
    ],
)
def test_the_join_script_refuses_a_missing_address_or_token_before_starting_anything(env, named):
    """S-TEAM-2: the cluster is named and joined with its token, or nothing starts."""
    result = _join(["true"], _clean_env(**env), timeout=30)
    assert result.returncode == 2 and re.search(named, result.stderr), result.stderr


@dataclass
class Head:
    address: str
    token: str
    process: subprocess.Popen
    temp_dir: str


def _processes_naming(text: str) -> list[int]:
    """Pids of this machine's processes whose command line names `text` (a directory
    only this test's Ray uses)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if text in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


@contextmanager
def loopback_head() -> Iterator[Head]:
    """A Ray head of the test's own: token auth, 2 CPUs, no GPUs, no dashboard, its
    daemons under one `ray start --block` process, which SIGTERM stops."""
    temp_dir = tempfile.mkdtemp(prefix="rh.", dir="/tmp")  # short: socket paths are limited
    token = secrets.token_hex(32)
    env = _clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    process = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port=0", "--num-cpus=2",
         "--num-gpus=0", "--include-dashboard=false", f"--temp-dir={temp_dir}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        address_file = Path(temp_dir) / "ray_current_cluster"
        deadline = time.monotonic() + 120
        while not (address_file.exists() and address_file.read_text().strip()):
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the head did not start within 120 s"
            time.sleep(0.2)
        yield Head(address_file.read_text().strip(), token, process, temp_dir)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        leftovers = _processes_naming(temp_dir)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not leftovers, f"the head left processes behind: {leftovers}"


@pytest.mark.slow
def test_a_wrong_token_fails_the_join_naming_the_token_within_its_timeout():
    with loopback_head() as head:
        started = time.monotonic()
        result = _join(["true"], _clean_env(RAY_ADDRESS=head.address, RAY_AUTH_TOKEN="0" * 64,
                                            PPO_RAY_JOIN_TIMEOUT_S="40"), timeout=120)
        seconds = time.monotonic() - started
    print(f"\nwrong token refused in {seconds:.1f} s: {result.stderr.splitlines()[0]}")
    assert result.returncode == 2, result.stderr
    assert f"could not join the Ray cluster at {head.address}" in result.stderr
    assert "RAY_AUTH_TOKEN" in result.stderr and seconds < 60


@pytest.mark.slow
def test_a_run_through_the_join_script_puts_no_role_on_the_flows_node_and_leaves_the_cluster_up(
    tiny_overrides, tmp_path
):
    node_dir = tempfile.mkdtemp(prefix="rj.", dir="/tmp")
    overrides = tiny_overrides + ["rl.max_steps=2", "rl.save_every=2", "job.name=joined"]
    with contextlib.ExitStack() as cleanup, loopback_head() as head:
        cleanup.callback(shutil.rmtree, node_dir, ignore_errors=True)
        env = _clean_env(RAY_ADDRESS=head.address, RAY_AUTH_TOKEN=head.token, PPO_RAY_NODE_TEMP_DIR=node_dir,
                         PREFECT_HOME=str(tmp_path / "prefect"))
        started = time.monotonic()
        result = _join([sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *overrides], env, 600)
        seconds = time.monotonic() - started
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
        joined = re.search(r"join-ray-then: node (\w+) joined the Ray cluster at (\S+) with 0 CPUs and 0 GPUs "
                           r"in (\d+) s", result.stderr)
        assert joined and joined.group(2) == head.address, result.stderr[-3000:]
        flow_node = joined.group(1)
        layout = re.search(r"^nodes: (.*)$", result.stdout, re.MULTILINE)
        assert layout, result.stdout[-3000:]
        by_node: dict[str, list[str]] = {}
        for part in layout.group(1).split("; "):
            prefix, roles = re.match(r"node (\w+) \([^)]*\): (.*)", part).groups()
            by_node[prefix] = roles.split(", ")
        print(f"\njoined in {joined.group(3)} s; run of 2 iterations through the join script {seconds:.1f} s; "
              f"actors per node: {by_node} (the flow's node: {flow_node[:8]})")
        assert flow_node[:8] not in by_node, by_node  # S-TEAM-2: no role on the zero-CPU node
        assert sorted(role for roles in by_node.values() for role in roles) == sorted(
            ["data", "reward", "replay", "policy", "rollout", "reference", "critic"]
        )
        assert (tmp_path / "outputs" / "joined" / "checkpoints" / "iter_000002" / "_SUCCESS").exists()
        # The run stopped nothing of the cluster: the head is up and answers; the flow's node left.
        assert head.process.poll() is None
        listing = subprocess.run([sys.executable, "-c", LIST_NODES, head.address], env=_clean_env(
            RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head.token), text=True, capture_output=True, timeout=120)
        assert "NODES " in listing.stdout, listing.stderr[-3000:]
        nodes = {node_id: alive for node_id, alive, _ in json.loads(listing.stdout.split("NODES ", 1)[1])}
        assert [alive for node_id, alive in nodes.items() if node_id != flow_node] == [True], nodes
        assert nodes.get(flow_node) is False, nodes
        assert not _processes_naming(node_dir), "the join script left its node's processes behind"
