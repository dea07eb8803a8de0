"""The Kubernetes work pool's base job template, checked by a real Prefect server
(S-TEAM-3): `prefect work-pool create --type kubernetes --base-job-template` accepts
deployments/kubernetes/base-job-template.json and refuses a copy that uses a variable
it does not declare. The session's Prefect API serves both (no server of its own);
the command runs in this process, as Prefect's own CLI tests run it."""

from __future__ import annotations

import json
import uuid

from prefect.testing.cli import invoke_and_assert

from tests.conftest import REPO_ROOT

TEMPLATE = REPO_ROOT / "deployments" / "kubernetes" / "base-job-template.json"


def test_the_server_accepts_the_base_job_template_and_refuses_a_broken_copy(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    name = f"ppo-kubernetes-{uuid.uuid4().hex[:8]}"
    invoke_and_assert(
        ["work-pool", "create", name, "--type", "kubernetes", "--base-job-template", str(TEMPLATE)],
        expected_code=0, expected_output_contains=f"Created work pool {name!r}",
    )
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(name)
        assert pool.type == "kubernetes"
        assert pool.base_job_template == json.loads(TEMPLATE.read_text())

    broken = json.loads(TEMPLATE.read_text())
    broken["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["priorityClassName"] = "{{ priority }}"
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    invoke_and_assert(
        ["work-pool", "create", f"{name}-broken", "--type", "kubernetes",
         "--base-job-template", str(tmp_path / "broken.json")],
        expected_code=1, expected_output_contains="undeclared variable(s): priority",
    )
