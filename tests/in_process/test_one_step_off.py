"""One step off the policy (S-ASYNC): iteration N+1's batch is generated with the
weights of N-1 while N trains, the policy refuses anything older, and a boundary holds
the batch in flight so a stopped run resumes to exactly the uninterrupted one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from algorithm.ppo_math import masked_mean
from algorithm.update_plan import MicroBatch
from checkpoint.in_flight import load_in_flight
from configs.loading import load_config
from flows.in_process import run_in_process
from roles.policy_role import StaleSampleError
from rundir.resume import ResumeError, find_resume_point
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import metric_records, without_timings

ONE_STEP_OFF = ["rl.max_steps=3", "rl.save_every=2", "rl.rollout.max_staleness=1"]


def test_a_stopped_one_step_off_run_resumes_to_the_uninterrupted_run(tiny_overrides):
    whole_config = load_config(TINY_PROFILE, tiny_overrides + ONE_STEP_OFF + ["job.name=whole"])
    whole, whole_roles = run_in_process(whole_config, paths=RunPaths.for_config(whole_config))
    assert [r["rollout/staleness"] for r in whole] == [0.0, 1.0, 1.0]
    assert all("train/behaviour_weight_truncated_fraction" in r for r in whole)
    _assert_the_decoupled_correction_is_applied(whole_roles.policy)

    config = load_config(TINY_PROFILE, tiny_overrides + ONE_STEP_OFF + ["job.name=split"])
    paths = RunPaths.for_config(config)
    run_in_process(config, max_steps=2, paths=paths)  # stops after the commit of iteration 2
    in_flight = load_in_flight(f"{paths.checkpoints}/iter_000002/in_flight").trajectory
    assert (in_flight.iteration, in_flight.policy_version) == (3, 1)  # generated during 2, with 1's weights
    _, resumed_roles = run_in_process(config, paths=paths, resume=True)

    rows = metric_records(Path(paths.run_dir))
    assert [r["iteration"] for r in rows] == [1, 2, 3]  # nothing skipped, nothing trained twice
    assert [without_timings(r) for r in rows] == [without_timings(r) for r in whole]
    for name in ("policy", "critic"):
        ours = getattr(resumed_roles, name).model.state_dict()
        theirs = getattr(whole_roles, name).model.state_dict()
        assert all(torch.equal(ours[key], theirs[key]) for key in theirs), name

    # A sample older than rl.rollout.max_staleness allows is refused by name.
    stale = dataclasses.replace(
        in_flight, batch_id="stale", ref_logprobs=in_flight.rollout_logprobs, values=in_flight.rollout_logprobs,
    )
    with pytest.raises(StaleSampleError, match=r"policy_version 1, the policy is at 3 \(rl.rollout.max_staleness=1\)"):
        resumed_roles.policy.prepare_batch(stale)

    # Synchronous again, this boundary's batch in flight would be skipped: refused.
    synchronous = load_config(TINY_PROFILE, tiny_overrides + ["rl.max_steps=6", "job.name=split"])
    with pytest.raises(ResumeError, match="rl.rollout.max_staleness=0, which would skip that batch"):
        find_resume_point(synchronous, RunPaths.for_config(synchronous), resume=True)


def _assert_the_decoupled_correction_is_applied(policy) -> None:
    """S-ASYNC-2: iteration 3 trained on samples of version 1 with the weights at 2, so
    pi_prox/pi_behav is not 1, and the loss the policy trained with carries it: a
    correction replaced by ones, or computed and then left out of the loss, fails here."""
    targets = policy.targets
    real = targets.response_mask.bool()
    assert targets.behaviour_weights is not None
    assert not torch.allclose(targets.behaviour_weights[real], torch.ones(int(real.sum())))
    everything = MicroBatch(torch.arange(targets.input_ids.shape[0]))
    with torch.no_grad():
        weighted, _ = policy._loss(targets, everything)  # per-token losses (b, r)
        plain, _ = policy._loss(dataclasses.replace(targets, behaviour_weights=None), everything)
    assert not torch.isclose(masked_mean(weighted, targets.response_mask), masked_mean(plain, targets.response_mask))
