"""No open doors (issue 16 item 8, S-SEC-1): Ray 2.60 listens on every interface
whatever node address it is given, so the Ray a run starts requires a token, made
fresh per process and kept in its environment, never in the home directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from roles.actors import protect_local_ray

pytestmark = [pytest.mark.ray]

JOIN = "import ray, sys; ray.init(address=sys.argv[1]); print('joined', int(ray.cluster_resources()['CPU']))"


def _joins(gcs_address: str, envs: list[dict[str, str]]) -> list[tuple[int, str, str]]:
    """Every client at once: a refused one retries for a while before it gives up."""
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", JOIN, gcs_address], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for env in envs
    ]
    results = []
    for client in clients:
        out, err = client.communicate(timeout=120)
        results.append((client.returncode, out, err))
    return results


def test_the_local_ray_refuses_a_client_without_the_runs_token(ray_cluster):
    import ray

    gcs = ray.get_runtime_context().gcs_address
    assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
    others = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    no_token = {**others, "RAY_AUTH_MODE": "disabled"}
    wrong_token = {**others, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
    # The run's own processes inherit the token: proof that the refusals are about it.
    *refused, joined = _joins(gcs, [no_token, wrong_token, dict(os.environ)])
    for returncode, out, _ in refused:
        assert returncode != 0 and "joined" not in out, out
    assert joined[0] == 0 and "joined 2" in joined[1], joined[2][-2000:]


def test_a_run_makes_its_own_token_keeps_a_users_token_and_refuses_disabled_auth():
    fresh: dict[str, str] = {}
    protect_local_ray(fresh)
    assert fresh["RAY_AUTH_MODE"] == "token" and len(fresh["RAY_AUTH_TOKEN"]) == 64
    again: dict[str, str] = {}
    protect_local_ray(again)
    assert again["RAY_AUTH_TOKEN"] != fresh["RAY_AUTH_TOKEN"]  # per process, not a shared secret on disk
    mine = {"RAY_AUTH_TOKEN_PATH": "/secrets/ray-token"}
    protect_local_ray(mine)
    assert mine == {"RAY_AUTH_TOKEN_PATH": "/secrets/ray-token", "RAY_AUTH_MODE": "token"}
    with pytest.raises(RuntimeError, match="RAY_AUTH_MODE='disabled'.*requires token authentication"):
        protect_local_ray({"RAY_AUTH_MODE": "disabled"})
