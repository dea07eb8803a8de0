"""Which device each role's models use, and the colocated trainer's park (S-RUN-4),
as far as a machine without a GPU can check them: the decision table, the movers
(onto PyTorch's `meta` device, which proves every tensor was visited without needing
a second real device), and that parking on the host changes nothing at all.

The CUDA half runs on a GPU machine: tests/services/test_gpu_roles.py."""

from __future__ import annotations

import pytest
import torch

from configs.loading import load_config
from placement.plan import DEVICE_ROLES, HOST_ROLES, plan_placement
from placement.role_placement import role_placements
from contracts.trajectory import PPOTargets
from trainer.update_runtime import UpdateRuntime, module_bytes, move_optimizer_state, targets_on
from tests.conftest import REPO_ROOT, TINY_PROFILE

PUBLIC_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")


@pytest.mark.parametrize(
    ("profile", "overrides", "parking_roles"),
    [
        # colocated, offload on: the trainer parks and the engine sleeps
        (PUBLIC_PROFILE, [], {"policy", "rollout"}),
        (PUBLIC_PROFILE, ["rl.colocated_offload=false"], set()),  # both stay resident
        (PUBLIC_PROFILE, ["grid.gpu_placement=disaggregated", "grid.policy_gpus=1", "grid.rollout_gpus=1"], set()),
        (TINY_PROFILE, [], set()),  # a CPU run: nothing to free
        # the one-GPU smoke layout
        (TINY_PROFILE, ["grid.gpus_per_node=1", "grid.policy_gpus=1"], {"policy", "rollout"}),
    ],
)
def test_only_the_colocated_policy_and_engine_on_a_gpu_park(profile, overrides, parking_roles):
    placements = role_placements(plan_placement(load_config(profile, overrides)))
    # One rule for every role: the host roles get a host placement, never parked.
    assert set(placements) == set(DEVICE_ROLES) | set(HOST_ROLES)
    assert all(p.device == "cpu" and not p.parks for role in HOST_ROLES for p in placements[role])
    assert {role for role, ranks in placements.items() if all(p.parks for p in ranks)} == parking_roles
    assert not any(p.parks for role in DEVICE_ROLES if role not in parking_roles for p in placements[role])


def test_every_rank_gets_its_own_placement_and_the_reference_one_per_gpu_or_host_rank():
    config = load_config(TINY_PROFILE, ["grid.cpu_trainer_ranks=2", "grid.cpu_rollout_engines=2"])
    placements = role_placements(plan_placement(config))
    assert [(p.rank, p.ranks) for p in placements["policy"]] == [(0, 2), (1, 2)]
    assert [(p.rank, p.ranks) for p in placements["rollout"]] == [(0, 2), (1, 2)]
    assert [(p.rank, p.ranks) for p in placements["reference"]] == [(0, 1)]  # cpu_trainer_ranks is the trainers'
    public = role_placements(plan_placement(load_config(PUBLIC_PROFILE)))
    assert len(public["policy"]) == 2 and len(public["reference"]) == 1  # grid.reference_gpus=1
    # S-SCALE-1: the frozen reference shards too, one rank per GPU or per grid.cpu_reference_ranks.
    two_gpus = role_placements(plan_placement(load_config(PUBLIC_PROFILE, ["grid.reference_gpus=2",
                                                                          "grid.gpus_per_node=5"])))
    assert [(p.rank, p.ranks, p.device) for p in two_gpus["reference"]] == [(0, 2, "cuda"), (1, 2, "cuda")]
    host = role_placements(plan_placement(load_config(TINY_PROFILE, ["grid.cpu_reference_ranks=2"])))
    assert [(p.rank, p.ranks) for p in host["reference"]] == [(0, 2), (1, 2)]
    assert len(host["policy"]) == len(host["critic"]) == 1


def test_roles_without_gpus_in_their_group_stay_on_the_host():
    cpu_run = role_placements(plan_placement(load_config(TINY_PROFILE)))
    assert {p.device for ranks in cpu_run.values() for p in ranks} == {"cpu"}
    assert {p.on_visible_device().device for ranks in cpu_run.values() for p in ranks} == {"cpu"}
    one_gpu = role_placements(plan_placement(load_config(TINY_PROFILE, ["grid.gpus_per_node=1", "grid.policy_gpus=1"])))
    assert one_gpu["reference"][0].device == "cpu" and one_gpu["critic"][0].device == "cpu"
    assert one_gpu["policy"][0].device == one_gpu["rollout"][0].device == "cuda"


@NO_CUDA
def test_gpu_groups_without_cuda_fall_back_to_the_host_and_do_not_park():
    placements = role_placements(plan_placement(load_config(PUBLIC_PROFILE)))  # every device role has a GPU group
    visible = [p.on_visible_device() for ranks in placements.values() for p in ranks]
    assert {p.device for p in visible} == {"cpu"}
    assert not any(p.parks for p in visible)  # on the host there is nothing to free
    assert [(p.rank, p.ranks) for p in visible] == [(p.rank, p.ranks) for ranks in placements.values() for p in ranks]


def _stepped(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(2, 4, dtype=torch.float32)).float().sum().backward()
    optimizer.step()


class _ToFloat(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


class _Cast(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.to(self.layer.weight.dtype))


def _model_and_optimizer(fused: bool = False):
    """A float32 layer and a bfloat16 one, stepped once: movers must keep each state's dtype."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), _Cast(torch.nn.Linear(3, 2).to(torch.bfloat16)), _ToFloat())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False, fused=fused)
    _stepped(model, optimizer)
    return model, optimizer


def _state_tensors(optimizer: torch.optim.Optimizer) -> dict[tuple[int, str], torch.Tensor]:
    return {
        (index, key): value
        for index, state in enumerate(optimizer.state.values())
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }


def test_moving_optimizer_state_to_its_own_device_copies_nothing():
    _, optimizer = _model_and_optimizer()
    before = _state_tensors(optimizer)
    assert len(before) == 4 * 3  # 4 parameters x (step, exp_avg, exp_avg_sq)
    moved = move_optimizer_state(optimizer, "cpu")
    after = _state_tensors(optimizer)
    assert all(after[key] is before[key] for key in before)  # the very tensors: no copy, values untouched
    moments = [t for (_, name), t in before.items() if name != "step"]
    assert moved == sum(t.numel() * t.element_size() for t in moments)
    assert {t.dtype for t in moments} == {torch.float32, torch.bfloat16}


@pytest.mark.parametrize("fused", [False, True])
def test_moving_optimizer_state_visits_every_tensor_and_keeps_dtypes(fused):
    _, optimizer = _model_and_optimizer(fused=fused)
    before = {key: (t.dtype, t.shape) for key, t in _state_tensors(optimizer).items()}
    move_optimizer_state(optimizer, "meta")
    after = _state_tensors(optimizer)
    assert {key: (t.dtype, t.shape) for key, t in after.items()} == before
    for (_, name), tensor in after.items():
        # torch keeps a plain AdamW's step counter on the host (load_state_dict's rule);
        # a fused AdamW steps it on the parameters' device, so it moves with them.
        expected = "cpu" if name == "step" and not fused else "meta"
        assert tensor.device.type == expected, (name, tensor.device)


def _runtime() -> UpdateRuntime:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model.register_buffer("counter", torch.zeros(5))
    runtime = UpdateRuntime("policy", model, load_config(TINY_PROFILE).rl.optimizer, lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    runtime.optimizer.step()
    return runtime


def test_placing_a_runtime_on_its_device_counts_its_bytes_and_moves_nothing():
    runtime = _runtime()
    assert runtime.device == torch.device("cpu")
    parameters = list(runtime.model.parameters())
    state = _state_tensors(runtime.optimizer)
    moments = sum(t.numel() * t.element_size() for (_, name), t in state.items() if name != "step")

    placed = runtime.place("cpu")

    # 12 + 3 + 6 + 2 parameters and a 5-element buffer, float32; then AdamW's two moments.
    assert placed == module_bytes(runtime.model) + moments == (12 + 3 + 6 + 2 + 5) * 4 + 2 * (12 + 3 + 6 + 2) * 4
    assert all(a is b for a, b in zip(parameters, runtime.model.parameters()))
    assert all(_state_tensors(runtime.optimizer)[key] is tensor for key, tensor in state.items())


def test_a_move_that_would_unlink_the_optimizer_from_the_model_is_refused():
    """Module.to keeps parameter objects between host and GPU but replaces them for
    other tensor types (here `meta`): the optimizer would then step stale copies."""
    runtime = _runtime()
    with pytest.raises(RuntimeError, match="replaced its parameter objects"):
        runtime.place("meta")


def _targets(batch: int = 2, prompt: int = 3, response: int = 2) -> PPOTargets:
    per_token = torch.arange(batch * response, dtype=torch.float32).reshape(batch, response)
    return PPOTargets(
        batch_id="iter000001-abc",
        iteration=1,
        policy_version=0,
        input_ids=torch.ones(batch, prompt + response, dtype=torch.long),
        attention_mask=torch.ones(batch, prompt + response, dtype=torch.long),
        prompt_length=prompt,
        response_mask=torch.ones(batch, response),
        old_logprobs=-per_token,
        old_values=per_token,
        advantages=per_token + 1,
        returns=per_token + 2,
        extras={"pixels": torch.zeros(1)},
    )


def test_targets_stay_the_same_object_on_the_host_and_move_whole_to_a_device():
    targets = _targets()
    assert targets_on(targets, torch.device("cpu")) is targets
    moved = targets_on(targets, torch.device("meta"))
    tensor_fields = (
        "input_ids",
        "attention_mask",
        "response_mask",
        "old_logprobs",
        "old_values",
        "advantages",
        "returns",
    )
    for name in tensor_fields:
        assert getattr(moved, name).device.type == "meta"
        assert getattr(moved, name).dtype == getattr(targets, name).dtype
    # Extras (packed pixels) stay on the host: model_io moves each micro-batch's rows.
    assert moved.extras is targets.extras and moved.batch_id == targets.batch_id and moved.prompt_length == 3


@pytest.mark.parametrize(
    "placement",
    [
        pytest.param([], id="cpu-run"),
        pytest.param(
            ["grid.gpus_per_node=1", "grid.policy_gpus=1", "rl.colocated_offload=true"],
            id="gpu-groups-no-cuda",
            marks=NO_CUDA,
        ),
    ],
)
def test_park_on_the_host_is_a_no_op_that_adds_no_metrics(placement, tiny_model_dir, tmp_path):
    from flows.in_process import run_in_process

    config = load_config(
        TINY_PROFILE,
        [f"model.path={tiny_model_dir}", f"job.output_root={tmp_path}", "rl.batch_size=8", "rl.minibatch_size=8",
         "rl.micro_batch_size=8", "rl.epochs=1", "rl.max_steps=1", *placement],
    )
    records, roles = run_in_process(config)  # one actor update: the optimizer has state
    policy = roles.policy
    assert not policy.parks and not policy.parked
    assert policy.ready()["device"] == "cpu"
    assert not any(key.startswith("perf/policy_park") for key in records[0])
    assert policy.runtime.optimizer.state  # something that a real park would have to move
    parameters = {name: (p, p.detach().clone()) for name, p in policy.model.named_parameters()}
    grads = {name: p.grad for name, p in policy.model.named_parameters()}
    assert all(g is not None for g in grads.values())  # a real park would drop these
    state = _state_tensors(policy.runtime.optimizer)
    state_values = {key: t.clone() for key, t in state.items()}

    assert policy.park() == {}

    assert not policy.parked
    for name, p in policy.model.named_parameters():
        original, value = parameters[name]
        assert p is original and torch.equal(p, value) and p.grad is grads[name]
    after = _state_tensors(policy.runtime.optimizer)
    assert after.keys() == state.keys()
    assert all(after[key] is state[key] and torch.equal(after[key], state_values[key]) for key in state)

