"""Roles on a real CUDA device (S-RUN-4, S-FLOW-6): models on the GPU, host tensors
between roles, the colocated policy's park/unpark cycle, and checkpoints written on
the GPU that load on the host. Skipped without CUDA; needs one GPU.

The roles run in-process (a role body is an ordinary class): without Ray,
`RolePlacement.on_visible_device` sees the process's GPU directly, so one GPU can stand in for every
group of a layout. The last test runs the flow over Ray actors with the one-GPU
layout `bench/gpu_smoke.sh` uses.
"""

from __future__ import annotations

import pytest
import torch

from flows.in_process import build_roles, run_in_process
from checkpoint.role_state import OPTIMIZER_FILE, model_tensors
from configs.loading import load_config
from tests.conftest import TINY_PROFILE, first_rank

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ONE_GPU = ["grid.gpus_per_node=1", "grid.policy_gpus=1", "grid.reference_gpus=0", "grid.critic_gpus=0"]
EVERY_ROLE_ON_A_GPU = ["grid.gpus_per_node=4", "grid.policy_gpus=2", "grid.reference_gpus=1", "grid.critic_gpus=1"]


def _config(tiny_model_dir, tmp_path, *overrides: str):
    return load_config(
        TINY_PROFILE,
        [f"model.path={tiny_model_dir}", f"job.output_root={tmp_path}", "rl.batch_size=8", "rl.minibatch_size=8",
         "rl.micro_batch_size=4", "rl.epochs=1", *overrides],
    )


def _devices(tensors) -> set[str]:
    return {t.device.type for t in tensors}


def _optimizer_devices(optimizer: torch.optim.Optimizer) -> set[str]:
    return {v.device.type for s in optimizer.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"}


def test_colocated_policy_parks_between_updates_and_trains_again(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, *ONE_GPU, "rl.colocated_offload=true")
    roles = build_roles(config)
    policy = roles.policy
    assert policy.parks and policy.parked  # parked from the start: the first rollout comes first
    assert policy.ready()["device"] == "cuda:0" and _devices(policy.model.parameters()) == {"cpu"}

    first = run_in_process(config, 1, roles=roles)[0][0]
    assert first["perf/policy_parked_bytes"] > 0 and first["perf/policy_park_seconds"] >= 0
    assert policy.parked and _devices(policy.model.parameters()) == {"cpu"}
    assert _optimizer_devices(policy.runtime.optimizer) == {"cpu"}

    policy._unpark()
    assert _devices(policy.model.parameters()) == {"cuda"} and _optimizer_devices(policy.runtime.optimizer) == {"cuda"}
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    summary = policy.park()
    parked = torch.cuda.memory_allocated()
    # Weights and both AdamW moments leave the GPU (the rollout engine keeps its own).
    assert resident - parked >= 0.9 * summary["perf/policy_parked_bytes"], (resident, parked, summary)

    # The park went into page-locked buffers, the same ones at every park (trainer/pinned_park.py),
    # and the optimizer still holds the model's own parameter objects.
    parameters = list(policy.model.parameters())
    assert all(p.data.is_pinned() for p in parameters)
    first_buffers = [p.data.data_ptr() for p in parameters]
    policy._unpark()
    policy.park()
    assert [p.data.data_ptr() for p in policy.model.parameters()] == first_buffers
    assert all(a is b for a, b in zip(policy.model.parameters(), policy.runtime.optimizer.param_groups[0]["params"]))
    assert all(v.is_pinned() for s in policy.runtime.optimizer.state.values() for k, v in s.items() if k != "step")

    step = policy.runtime.optimizer_step
    before = {k: v.clone() for k, v in model_tensors(policy.model).items()}
    second = run_in_process(config, 2, roles=roles, start=2)[0][0]
    assert policy.runtime.optimizer_step > step and second["train/policy_version"] == 2.0
    assert any(not torch.equal(before[k], v) for k, v in model_tensors(policy.model).items())  # it trained
    assert policy.parked and torch.isfinite(torch.tensor(second["train/policy_loss"]))


def test_every_role_computes_on_its_gpu_and_hands_host_tensors_on(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, *EVERY_ROLE_ON_A_GPU, "rl.colocated_offload=false")
    roles = build_roles(config)
    assert roles.policy.ready()["device"] == roles.critic.ready()["device"] == "cuda:0"
    assert roles.reference.ready()["device"] == "cuda:0" and roles.rollout.engine.device.type == "cuda"
    assert not roles.policy.parks  # offload off: both stay resident

    prompts, _ = roles.data.next_batch(1, 8)
    trajectory, _ = roles.rollout.generate(prompts, 0)
    trajectory, _ = roles.reward.score(trajectory)
    trajectory, _, _ = roles.replay.add(trajectory)
    trajectory, _ = roles.reference.score(trajectory)
    trajectory, _ = roles.critic.predict(trajectory)
    targets, metrics = roles.policy.prepare_batch(trajectory)
    assert trajectory.ref_logprobs.device.type == trajectory.values.device.type == "cpu"
    assert {
        getattr(targets, name).device.type for name in ("input_ids", "old_logprobs", "advantages", "returns")
    } == {"cpu"}
    assert metrics["rollout/logprob_abs_diff"] < 1e-2  # the trainer's GPU forward agrees with the engine's

    roles.critic.install_targets(targets)
    from algorithm.update_plan import UpdatePlan

    plan = UpdatePlan(1, 8, 4, config.job.seed, 1)
    receipts = [roles.policy.train_batch(plan, targets.batch_id), roles.critic.train_batch(plan, targets.batch_id)]
    assert all(isinstance(v, float) for r in receipts for v in r.metrics.values())
    weights, version = roles.policy.publish_weights()
    assert version == 1 and _devices(weights.values()) == {"cpu"}
    assert roles.rollout.load_weights(weights, version)["perf/weight_sync_bytes"] > 0


def test_a_checkpoint_written_on_the_gpu_loads_on_the_host_and_back(tiny_model_dir, tmp_path):
    from roles.policy_role import PolicyRole

    gpu_config = _config(tiny_model_dir, tmp_path, *ONE_GPU, "rl.colocated_offload=true")
    roles = build_roles(gpu_config)
    run_in_process(gpu_config, 1, roles=roles)
    policy = roles.policy
    parked_report = policy.save(str(tmp_path / "parked"))  # written from the host copy
    policy._unpark()
    resident_report = policy.save(str(tmp_path / "resident"))  # written from the GPU
    assert resident_report["model_digest"] == parked_report["model_digest"]
    assert resident_report["optimizer_digest"] == parked_report["optimizer_digest"]

    # No map_location: every tensor in the file is a host tensor.
    saved = torch.load(tmp_path / "resident" / OPTIMIZER_FILE, weights_only=True)
    assert _devices(v for s in saved["state"].values() for v in s.values() if torch.is_tensor(v)) == {"cpu"}

    expected = model_tensors(policy.model)
    host_config = _config(tiny_model_dir, tmp_path)
    on_host = PolicyRole(host_config, first_rank(host_config, "policy"))
    on_host.load(str(tmp_path / "resident"))
    assert all(torch.equal(expected[k], v) for k, v in model_tensors(on_host.model).items())
    assert _optimizer_devices(on_host.runtime.optimizer) == {"cpu"}

    resident_config = _config(tiny_model_dir, tmp_path, *ONE_GPU, "rl.colocated_offload=false")
    on_gpu = PolicyRole(resident_config, first_rank(resident_config, "policy"))
    on_gpu.load(str(tmp_path / "resident"))
    assert _devices(on_gpu.model.parameters()) == {"cuda"} and _optimizer_devices(on_gpu.runtime.optimizer) == {"cuda"}
    assert all(torch.equal(expected[k], v) for k, v in model_tensors(on_gpu.model).items())
    assert on_gpu.save(str(tmp_path / "again"))["optimizer_digest"] == resident_report["optimizer_digest"]


def test_flow_parks_the_policy_every_iteration_on_one_gpu(prefect_api, ray_cluster, tiny_overrides, tmp_path):
    from flows.training import ppo
    from tests.support.helpers import metric_records

    ppo(profile=TINY_PROFILE, overrides=tiny_overrides + ONE_GPU + ["rl.max_steps=3", "job.name=gpu-park"],
        critic_warmup_iterations=1)
    records = metric_records(tmp_path / "outputs" / "gpu-park")
    assert [r["train/actor_warmup"] for r in records] == [1.0, 0.0, 0.0]
    # prepare_batch brings the policy back every iteration; it parks again after
    # prepare_batch in the warmup iteration and after publishing its weights in the others.
    assert all(r["perf/policy_parked_bytes"] > 0 for r in records)
