"""S-CW-3 and the architecture's promise: the flow over Ray actors computes exactly
what the role bodies compute in process. The iteration program is one
(flows/iteration.py), run by two runners; with N=0 (the flow's warmup code path
present but inactive) metrics and final weights are equal, and so are the boundaries
both commit."""

from __future__ import annotations


from algorithm.metrics_catalogue import uncatalogued
from checkpoint.digest import state_digest
from checkpoint.role_state import model_tensors
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from flows.training import resolve_config
from tests.conftest import TINY_PROFILE
from tests.support.helpers import boundary, metric_records, weights_digest, without_timings


def test_flow_with_zero_warmup_equals_the_in_process_run(golden_run, tmp_path):
    run_dir = golden_run.run_dir
    in_process_overrides = [o for o in golden_run.overrides if not o.startswith("job.output_root=")] + [
        f"job.output_root={tmp_path / 'outputs'}", "job.name=golden-in-process",
    ]
    config = resolve_config(TINY_PROFILE, in_process_overrides, 0, None)
    in_process, roles = run_in_process(config, paths=RunPaths.for_config(config))

    records = metric_records(run_dir)
    assert [without_timings(r) for r in records] == [without_timings(r) for r in in_process]
    assert [sorted(r) for r in records] == [sorted(r) for r in in_process]  # time/* keys too
    # S-SCALE-3, S-XFER-1: over Ray each version reached the engine as many buckets read
    # over NIXL from the policy's process, and the engine still computed exactly what
    # the in-process one did.
    assert all(r["perf/weight_sync_buckets"] > 4 for r in records)
    assert all(r["perf/weight_sync_nixl_bytes"] >= r["perf/weight_sync_bytes"] > 0 for r in records)
    # The flow's own keys (commit timing included) are all in the metrics catalogue.
    assert uncatalogued(records) == [] and "time/commit_seconds" in records[-1]
    final = boundary(run_dir, 3)
    assert weights_digest(final / "policy") == state_digest(model_tensors(roles.policy.model))
    assert weights_digest(final / "critic") == state_digest(model_tensors(roles.critic.model))
    in_process_final = boundary(tmp_path / "outputs" / "golden-in-process", 3)
    assert weights_digest(in_process_final / "policy") == weights_digest(final / "policy")
    assert (in_process_final / "_SUCCESS").is_file()
