"""A real multi-node Ray cluster (issue 17 item 5): a head with no CPUs and two worker
nodes on this machine (tests/services/cluster.py). With `grid.num_nodes=2` the plan,
not the scheduler, decides which node each role lands on; the flow joins the cluster
through RAY_ADDRESS with the cluster's token; a lost node fails the run naming the
stage, the role and the node (S-FAULT-1); a rerun with a node back resumes bitwise
(S-CKPT-8). Each test starts its own cluster, and whatever joins it runs in a
subprocess: this process may already hold the session's local Ray."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TINY_PROFILE
from tests.support.helpers import assert_ends_like_the_uninterrupted_run

pytestmark = [pytest.mark.slow]

PROBE = r"""
import json, sys, time
import ray
from configs.loading import load_config
from flows.flow_runner import FlowRunner
from placement.plan import plan_placement
from placement.ray_lowering import PlacementError, lower_placement
from processes.actors import ROLE_CLASSES, RoleHandles
from processes.ray_session import worker_env

@ray.remote
class Probe:
    def ping(self):
        return "pong"

ray.init(address=sys.argv[1], log_to_driver=False, runtime_env={"env_vars": worker_env()})
lowered = lower_placement(plan_placement(load_config(sys.argv[2], ["grid.num_nodes=2"])), namespace="probe")
handles = RoleHandles(**{role: Probe.options(**lowered.actor_options(role)).remote() for role in ROLE_CLASSES})
ray.get([handle.ping.remote() for _, handle in handles.items()])  # ready, as the flow's actors are before its runner
runner = FlowRunner(handles)  # asks every actor for its node, as the flow does
print("LAYOUT " + json.dumps(runner.layout()), flush=True)
removed = float(sys.stdin.readline())  # when the test began to remove the reference's node (one clock per machine)
try:
    ray.get(handles.reference.ping.remote(), timeout=60)
    message = "no error"
except Exception as error:
    message = f"{type(error).__name__}: {runner.explain(error)}"
seconds = time.monotonic() - removed
try:  # a relaunch on the one node left is refused up front, not left pending
    lower_placement(plan_placement(load_config(sys.argv[2], ["grid.num_nodes=2"])), namespace="again")
    refused = "not refused"
except PlacementError as error:
    refused = str(error)
print("FAILED " + json.dumps({"message": message, "seconds": seconds, "refused": refused}),
      flush=True)
"""


def test_the_plan_spreads_roles_over_the_worker_nodes_and_a_lost_node_is_named():
    from tests.services.cluster import head_and_workers

    with head_and_workers() as cluster:
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, cluster.address, TINY_PROFILE], cwd=REPO_ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            line = probe.stdout.readline()
            assert line.startswith("LAYOUT "), line + probe.stderr.read()[-3000:]
            layout = json.loads(line.removeprefix("LAYOUT "))
            workers = {node.node_id: node for node in cluster.worker_nodes}
            # Colocated tiny plan: actor group (policy+rollout) and critic on the first
            # node with the host roles beside the rollout, the reference on the second.
            assert set(layout) == set(workers), (layout, list(workers))  # both workers, never the head
            by_role = {label: node for node, labels in layout.items() for label in labels}
            assert len({by_role[r] for r in ("policy", "rollout", "critic", "data", "reward", "replay")}) == 1
            assert by_role["reference"] != by_role["policy"]
            removed = time.monotonic()
            cluster.remove_node(workers[by_role["reference"]])
            probe.stdin.write(f"{removed}\n")
            probe.stdin.flush()
            line = probe.stdout.readline()
            assert line.startswith("FAILED "), line + probe.stderr.read()[-3000:]
            failed = json.loads(line.removeprefix("FAILED "))
        finally:
            probe.kill()
            probe.communicate()
    print(f"\nlost node: named {failed['seconds']:.1f} s after removal: {failed['message'][:200]}")
    node = by_role["reference"][:8]
    assert re.match(rf"Actor\w+Error: the reference actor on node {node} \(.*\) is gone: node {node} .* left the "
                    r"Ray cluster \(it held reference\)", failed["message"]), failed["message"]
    assert failed["seconds"] < 30
    assert failed["refused"].startswith("grid.num_nodes=2 but the Ray cluster has 1 alive node(s) with CPUs")


class Output:
    """A process's output lines as they arrive, each with the time it arrived."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, pattern: str) -> tuple[float, str] | None:
        return next(((t, line) for t, line in self.lines if re.search(pattern, line)), None)

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "\n".join(line for _, line in self.lines)


def _launch(cluster_address: str, overrides: list[str], prefect_home: Path) -> tuple[subprocess.Popen, Output, Output]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(RAY_ADDRESS=cluster_address, PREFECT_HOME=str(prefect_home))  # the cluster's token is inherited
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *overrides],
        cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    return process, Output(process.stdout), Output(process.stderr)


def _node_layout(stdout: Output, cluster) -> dict[str, str]:
    """Role -> worker node id, from the flow's `nodes:` start-up line."""
    found = stdout.first(r"^nodes: ")
    assert found, stdout.text()
    by_role = {}
    for part in found[1].removeprefix("nodes: ").split("; "):
        prefix, roles = re.match(r"node (\w+) \([^)]*\): (.*)", part).groups()
        matches = [n.node_id for n in [cluster.head_node, *cluster.worker_nodes] if n.node_id.startswith(prefix)]
        assert len(matches) == 1, (prefix, matches)
        by_role.update({role: matches[0] for role in roles.split(", ")})
    return by_role


def test_a_run_spread_over_two_nodes_loses_one_fails_naming_it_and_resumes_bitwise(tiny_overrides, tmp_path):
    from tests.services.cluster import WORKER_CPUS, head_and_workers
    from tests.support.helpers import boundary

    overrides = tiny_overrides + ["rl.max_steps=4", "rl.save_every=2", "job.name=two-nodes", "grid.num_nodes=2"]
    run_dir = tmp_path / "outputs" / "two-nodes"
    with head_and_workers() as cluster:
        process, stdout, stderr = _launch(cluster.address, overrides, tmp_path / "prefect")
        try:
            deadline = time.monotonic() + 400
            metrics = run_dir / "metrics.jsonl"
            while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
                assert process.poll() is None and time.monotonic() < deadline, stdout.text() + stderr.text()
                time.sleep(0.05)
            by_role = _node_layout(stdout, cluster)
            workers = {node.node_id: node for node in cluster.worker_nodes}
            assert set(by_role.values()) == set(workers), (by_role, list(workers))  # both workers, not the head
            lost = by_role["policy"]
            removed = time.monotonic()
            cluster.remove_node(workers[lost])  # mid-iteration 3: the rows of 1 and 2 are written
            process.wait(timeout=300)
        finally:
            process.kill()
        failure = stderr.first(r"^error: \w+\[iter=\d+\] failed")
        assert process.returncode == 1 and failure, stdout.text() + stderr.text()
        detected = stderr.first(r"\[iter=\d+\]' - .*(Finished in state Failed|failed)|^error: ")
        print(f"\nlost node: the flow logged the failure {detected[0] - removed:.1f} s after removal "
              f"({detected[1][:160]}); its last line {failure[0] - removed:.1f} s after removal: {failure[1][:300]}")
        held = [role for role, node in by_role.items() if node == lost]
        assert re.match(rf"^error: \w+\[iter=3\] failed: \w+Error: .*node {lost[:8]} \(.*\) left the Ray cluster",
                        failure[1]), failure[1]
        assert any(f"the {role} actor" in failure[1] for role in held), (held, failure[1])
        assert failure[0] - removed < 60
        # No half-written boundary: every one on disk is committed, the pointer at the last.
        boundaries = sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*"))
        assert boundaries == ["iter_000002"] and (boundary(run_dir, 2) / "_SUCCESS").exists(), boundaries
        assert (run_dir / "checkpoints" / "latest_checkpoint.txt").read_text().strip() == "iter_000002"

        cluster.add_node(num_cpus=WORKER_CPUS, num_gpus=0)  # a node back
        cluster.wait_for_nodes()
        process, stdout, stderr = _launch(cluster.address, overrides, tmp_path / "prefect")
        try:
            process.wait(timeout=400)
        finally:
            process.kill()
        assert process.returncode == 0, stdout.text() + stderr.text()
        assert stdout.first(r"^resume: from .*iter_000002"), stdout.text()
        assert set(_node_layout(stdout, cluster).values()) <= {node.node_id for node in cluster.worker_nodes}

    # The uninterrupted run is a local one.
    assert_ends_like_the_uninterrupted_run(run_dir, overrides + ["grid.num_nodes=1"], "straight", 4)
