"""A run joining a cluster ships its profile's folder to the nodes (S-BYO-3, S-TEAM-2):
a cluster of this machine (tests/services/cluster.py) whose worker node never had the
folder on its path or in its environment, and the folder deleted once the driver has
joined, still builds the reward role from the module beside the profile, on the worker
node, from the copy Ray's runtime_env shipped; a `profile.py` among the shipped files
hides nothing of the standard library there. The driver runs in a subprocess: this
process may hold the session's local Ray."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow]

PROFILE = '''from configs.ppo_tiny_cpu import CONFIG as BASE
from configs.schema import RewardConfig

CONFIG = BASE.model_copy(update={"rl": BASE.rl.model_copy(update={
    "reward": RewardConfig(terminal_callable="beside_the_profile:score")})})
'''

DRIVER = r"""
import importlib.util, json, shutil, sys
import ray
from configs.code_folders import code_dirs_of
from configs.loading import load_config
from processes.ray_session import join_ray

profile = sys.argv[2]
config = load_config(profile)
code_dirs = code_dirs_of(profile)
session = join_ray(sys.argv[1], code_dirs)
shutil.rmtree(code_dirs[0])  # from here on only the shipped copy exists anywhere


@ray.remote(num_cpus=1)
def build_the_reward_role(config):
    from roles.reward_role import RewardRole

    role = RewardRole(config)  # imports the reward named in the config, as the actor does
    return {"terminal": role.ready()["terminal"], "file": sys.modules["beside_the_profile"].__file__,
            "profile_module": importlib.util.find_spec("profile").origin, "base_prefix": sys.base_prefix,
            "node": ray.get_runtime_context().get_node_id()}


print("BUILT " + json.dumps(ray.get(build_the_reward_role.remote(config), timeout=240)), flush=True)
"""


def test_a_joined_cluster_imports_the_module_beside_the_profile_from_the_shipped_copy(tmp_path):
    from tests.services.cluster import head_and_workers

    folder = tmp_path / "my-project"
    folder.mkdir()
    (folder / "profile.py").write_text(PROFILE)  # named like the standard module on purpose
    (folder / "beside_the_profile.py").write_text("def score(ctx):\n    return ctx.completion == ctx.reference\n")
    with head_and_workers(workers=1) as cluster:
        [worker] = [node.node_id for node in cluster.worker_nodes]
        result = subprocess.run(
            [sys.executable, "-c", DRIVER, cluster.address, str(folder / "profile.py")],
            cwd=REPO_ROOT, text=True, capture_output=True, timeout=400,
        )
    assert result.returncode == 0 and "BUILT " in result.stdout, result.stdout[-3000:] + result.stderr[-5000:]
    built = json.loads(result.stdout.split("BUILT ", 1)[1])
    assert built["terminal"] and built["node"] == worker  # the head has no CPUs: the worker node built it
    assert not folder.exists() and not built["file"].startswith(str(tmp_path))  # the shipped copy
    assert "ppo_code_" in built["file"]
    assert built["profile_module"].startswith(built["base_prefix"])  # the standard library's `profile`
