"""No open doors (issue 16 item 8, S-SEC-1): Ray 2.60 listens on every interface
whatever node address it is given, so the Ray a run starts requires a token, made
fresh per process and kept in its environment, never in the home directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from processes.ray_session import protect_local_ray

JOIN = "import ray, sys; ray.init(address=sys.argv[1]); print('joined', int(ray.cluster_resources()['CPU']))"


# A refused client retries its connection once a second, 20 times by default; three
# tries are as much proof and save the suite 17 s (issue 19).
FEW_RETRIES = {"RAY_NUM_REDIS_GET_RETRIES": "3"}


def _joins(gcs_address: str, envs: list[dict[str, str]]) -> list[tuple[int, str, str]]:
    """Every client at once: a refused one retries for a while before it gives up."""
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", JOIN, gcs_address], env={**env, **FEW_RETRIES}, text=True,
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


def _listeners_of(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket these processes listen on (`ss`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        address, port = line.split()[3].rsplit(":", 1)
        for pid in pids:
            if f"pid={pid}," in line:
                found.append((address.strip("[]"), int(port), pid))
    return found


def _descendants(root: int) -> set[int]:
    children = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == root:
                        children.add(int(entry))
            except OSError:
                continue
    return children | {pid for child in children for pid in _descendants(child)}


def test_no_listener_of_the_local_ray_answers_without_the_token(ray_cluster):
    """S-SEC-1: every socket the session's local Ray listens on beyond loopback refuses
    a client without the run's token: its gRPC ports (the join test above) and its
    HTTP agents (401); the autoscaler's open metrics endpoint is not started."""
    import http.client
    import urllib.error
    import urllib.request

    import ray

    ray.get(ray.remote(lambda: None).remote())  # a worker process too
    listeners = [entry for entry in _listeners_of(_descendants(os.getpid())) if not entry[0].startswith("127.")]
    assert listeners, "expected the local Ray's listeners"
    assert all(port != 44217 for _, port, _ in listeners)  # the autoscaler's Prometheus endpoint
    node_ip = ray.util.get_node_ip_address()
    for address, port, pid in listeners:
        host = node_ip if address in ("*", "0.0.0.0", "::") else address
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as response:
                answered = response.status
        except urllib.error.HTTPError as error:
            answered = error.code
        except (OSError, ValueError, http.client.HTTPException):  # a gRPC port: not an HTTP server at all
            continue
        assert answered == 401, f"{address}:{port} (pid {pid}) answered {answered} without the token"


REFUSED_JOIN = r"""
import os, sys
os.environ.pop("RAY_ADDRESS", None)
for key in [k for k in os.environ if k.startswith("RAY_AUTH")]:
    del os.environ[key]
import processes.ray_auth_first  # as the flow's module does: no RAY_ADDRESS, so a local Ray's token is made
from processes.ray_session import ClusterTokenMissing, init_ray
try:
    init_ray(address=sys.argv[1])  # what a deployment's grid.ray_address asks for
except ClusterTokenMissing as error:
    print("REFUSED " + str(error))
"""


def test_a_run_naming_a_cluster_without_its_token_is_refused_and_never_joins_with_its_own():
    """S-TEAM-2: a deployment whose parameters set grid.ray_address, started without
    RAY_ADDRESS, holds only the token it made at import; it is refused before it
    contacts the cluster (the address here answers nothing), naming what to set."""
    result = subprocess.run([sys.executable, "-c", REFUSED_JOIN, "10.0.0.1:6379"], text=True, capture_output=True,
                            timeout=120)
    assert "REFUSED " in result.stdout, result.stdout + result.stderr[-3000:]
    message = result.stdout.split("REFUSED ", 1)[1]
    assert "the Ray cluster at 10.0.0.1:6379" in message and "RAY_ADDRESS=10.0.0.1:6379" in message
    assert "RAY_AUTH_TOKEN" in message and "RAY_AUTH_TOKEN_PATH" in message
