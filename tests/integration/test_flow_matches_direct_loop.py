"""S-CW-3 and the architecture's promise: the flow over Ray actors computes exactly
what the role bodies compute in a plain loop. With N=0 (the flow's warmup code path
present but inactive) metrics and final weights equal a loop that never heard of
warmup's skip logic beyond the predicate (`bench.direct_loop`)."""

from __future__ import annotations

import pytest

from algorithm.metrics_catalogue import uncatalogued
from bench.direct_loop import build_roles, run_direct
from checkpoint.digest import state_digest
from checkpoint.role_state import model_tensors
from flows.ppo import resolve_config
from tests.conftest import TINY_PROFILE
from tests.integration.helpers import boundary, metric_records, weights_digest, without_timings

pytestmark = [pytest.mark.ray, pytest.mark.prefect]


def test_flow_with_zero_warmup_equals_the_direct_loop(prefect_api, ray_cluster, tiny_overrides, tmp_path):
    from flows.ppo import ppo

    overrides = tiny_overrides + ["rl.max_steps=3", "job.name=golden"]
    ppo(profile=TINY_PROFILE, overrides=overrides, critic_warmup_iterations=0)
    run_dir = tmp_path / "outputs" / "golden"

    roles = build_roles(resolve_config(TINY_PROFILE, overrides, 0, None))
    direct = run_direct(resolve_config(TINY_PROFILE, overrides, 0, None), roles=roles)

    records = metric_records(run_dir)
    assert [without_timings(r) for r in records] == [without_timings(r) for r in direct]
    # The flow's own keys (commit timing included) are all in the metrics catalogue.
    assert uncatalogued(records) == [] and "time/commit_seconds" in records[-1]
    final = boundary(run_dir, 3)
    assert weights_digest(final / "policy") == state_digest(model_tensors(roles.policy.model))
    assert weights_digest(final / "critic") == state_digest(model_tensors(roles.critic.model))
