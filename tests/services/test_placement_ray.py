"""Device groups lowered onto a real Ray cluster (S-RUN-4). This machine has no GPU,
so the cluster is started with logical GPUs (`ray.init(num_gpus=4)`): Ray schedules
and assigns GPU ids exactly as on a GPU node, which is what placement decides; only
the CUDA work itself is missing. Runs in a subprocess because the session's own Ray
has no GPUs and one process holds one Ray."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

PUBLIC_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")

SCRIPT = r"""
import json, os, sys
import ray
from configs.loading import load_config
from processes.ray_session import worker_env
from placement.plan import plan_placement
from placement.ray_lowering import PlacementError, lower_placement, release_placement

from processes.ray_session import protect_local_ray
protect_local_ray(os.environ)  # the same token auth a run uses (S-SEC-1)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# "local": never a cluster someone started with `ray start` on this machine
ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False,
         runtime_env={"env_vars": worker_env()})

# A task with each role's actor options gets the GPUs an actor with them would get (the
# same resources, bundle and scheduling strategy); tasks run in reused workers, where 15
# probe actors cost 15 worker processes (issue 19: 37 s of this test's 47 s).
@ray.remote
def gpus():
    return [str(i) for i in ray.get_gpu_ids()]

def place(overrides, namespace):
    plan = plan_placement(load_config(PROFILE, overrides))
    lowered = lower_placement(plan, namespace=namespace, ready_timeout_s=30)
    roles = ("policy", "rollout", "reference", "critic", "data")
    seen = dict(zip(roles, ray.get([gpus.options(**lowered.actor_options(role)).remote() for role in roles])))
    release_placement(lowered)
    return seen

result = {
    "colocated": place([], "t-colocated"),
    "disaggregated": place(["grid.gpu_placement=disaggregated", "grid.policy_gpus=1", "grid.rollout_gpus=1"], "t-dis"),
    "one_gpu": place(
        ["grid.gpus_per_node=1", "grid.policy_gpus=1", "grid.reference_gpus=0", "grid.critic_gpus=0"], "t-one"
    ),
}
try:
    too_big = plan_placement(load_config(PROFILE, ["grid.gpus_per_node=8", "grid.policy_gpus=6"]))
    lower_placement(too_big, namespace="t-big")
except PlacementError as error:
    result["too_big"] = str(error)
print("RESULT " + json.dumps(result))
ray.shutdown()
"""


@pytest.mark.slow  # 23 s: a Ray of its own with logical GPUs; the plan itself is tests/pure
def test_colocated_and_disaggregated_groups_on_logical_gpus():
    result = subprocess.run(
        [sys.executable, "-c", f"PROFILE = {PUBLIC_PROFILE!r}\n" + SCRIPT],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stdout[-3000:] + result.stderr[-3000:]
    seen = json.loads(lines[0].removeprefix("RESULT "))

    colocated = seen["colocated"]
    # Policy and rollout share one GPU (bundle 0 of the actor group); reference and
    # critic each hold their own; host roles hold none.
    assert len(colocated["policy"]) == 1 and colocated["policy"] == colocated["rollout"]
    owners = [colocated["policy"][0], colocated["reference"][0], colocated["critic"][0]]
    assert len(set(owners)) == 3
    assert colocated["data"] == []

    disaggregated = seen["disaggregated"]
    gpus = [disaggregated[role][0] for role in ("policy", "rollout", "reference", "critic")]
    assert len(set(gpus)) == 4

    one_gpu = seen["one_gpu"]  # a one-GPU workstation: reference and critic stay on the host
    assert len(one_gpu["policy"]) == 1 and one_gpu["policy"] == one_gpu["rollout"]
    assert one_gpu["reference"] == [] and one_gpu["critic"] == []

    # 6 + 1 + 1 GPUs on a 4-GPU cluster: refused up front, naming the keys.
    assert "has 4 GPU(s)" in seen["too_big"] and "grid.policy_gpus=6" in seen["too_big"]
