"""deployments/prefect.yaml, read as `prefect deploy` reads it, without a server.

Issue 18 item 5: the public deployment lets one run at a time hold the node's GPUs; a
second run is enqueued (state `AwaitingConcurrencySlot`, visible in the UI), not
started beside it. The slow deployment test reads the limit back from a real server
(tests/services/test_deployment.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

PREFECT_YAML = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"


def _deployments() -> dict[str, dict]:
    return {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}


def test_the_gpu_deployment_runs_one_at_a_time_and_enqueues_the_next():
    from prefect.cli.deploy._models import DeploymentConfig

    public = _deployments()["public-4gpu"]
    parsed = DeploymentConfig.model_validate(public)  # Prefect's own schema of a deployment entry
    assert public["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"}
    assert parsed.concurrency_limit is not None


def test_the_cpu_deployment_is_not_limited():
    assert "concurrency_limit" not in _deployments()["tiny-cpu"]
