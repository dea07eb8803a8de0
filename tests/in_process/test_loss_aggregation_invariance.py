"""S-PATH-2 and S-PATH-3: one minibatch's gradient is the same however the runtime cuts
it: micro-batches of 1, 2, 4 or all 8 rows, token-budget micro-batches trimmed to their
own rows, and two data-parallel ranks against one; for every `rl.loss_aggregation`,
for the policy's and the critic's own losses, in float64 (relative 1e-6).

The rows differ in prompt and response length (prompts left-padded, responses
right-padded) and one holds an untrained observation token, so a cut that weighed rows
by their count, or a trim that moved positions, would show."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from algorithm.loss_aggregation import LOSS_AGGREGATIONS
from algorithm.token_budget import RowTooLong
from tests.in_process.fsdp_ranks import (
    CUTS,
    gradient_ranks,
    gradient_runtime,
    minibatch_gradient,
    ragged_targets,
    role_loss,
    small_qwen3,
    small_value_model,
    spawn,
)

MODES = list(LOSS_AGGREGATIONS)


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=1e-12, msg=f"{what}: {name}")


@pytest.fixture(scope="module")
def policy():
    update = gradient_runtime(0, 1, "")
    targets = ragged_targets(small_qwen3(seed=0).double())
    return update, targets, role_loss("policy", update.model)


@pytest.fixture(scope="module")
def one_rank_gradients(policy):
    update, targets, loss_fn = policy
    return {mode: minibatch_gradient(update, targets, loss_fn, mode) for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_policy_gradient_does_not_depend_on_the_cut(policy, one_rank_gradients, mode):
    update, targets, loss_fn = policy
    for cut, (micro_batch_size, tokens) in CUTS.items():
        got = minibatch_gradient(update, targets, loss_fn, mode, micro_batch_size, tokens)
        _assert_same(got, one_rank_gradients[mode], f"{mode}, {cut}")


@pytest.mark.parametrize("role", ["policy", "critic"])
def test_packed_micro_batches_give_the_padded_gradient(policy, one_rank_gradients, role):
    """Token-budget micro-batches run as packed rows (one row of real tokens, positions
    restarting per row: models/packed_rows.py) give the whole minibatch's gradient too,
    with the CPU's SDPA, which honours the row boundaries through a block mask."""
    from configs.schema import OptimizerConfig
    from trainer.update_runtime import UpdateRuntime

    if role == "policy":
        update, targets, _ = policy
        whole = one_rank_gradients["token_mean"]
    else:
        update = UpdateRuntime("critic", small_value_model().double(), OptimizerConfig(max_grad_norm=1e9), lr=0.0)
        targets = ragged_targets(small_qwen3(seed=0).double())
        whole = minibatch_gradient(update, targets, role_loss("critic", update.model), "token_mean")
    packed = role_loss(role, update.model, packs_rows=True)
    for cut in ("tokens11", "tokens25"):
        _assert_same(minibatch_gradient(update, targets, packed, "token_mean", *CUTS[cut]), whole, f"packed, {cut}")


def test_the_aggregations_are_different_objectives(one_rank_gradients):
    """Otherwise the test above could pass with one formula under four names."""
    norms = {mode: float(one_rank_gradients[mode]["model.norm.weight"].norm()) for mode in MODES}
    assert len({round(norm, 9) for norm in norms.values()}) == len(MODES), norms


@pytest.mark.parametrize("mode", MODES)
def test_critic_gradient_does_not_depend_on_the_cut(mode):
    from configs.schema import OptimizerConfig
    from trainer.update_runtime import UpdateRuntime

    update = UpdateRuntime("critic", small_value_model().double(), OptimizerConfig(max_grad_norm=1e9), lr=0.0)
    targets = ragged_targets(small_qwen3(seed=0).double())
    loss_fn = role_loss("critic", update.model)
    whole = minibatch_gradient(update, targets, loss_fn, mode)
    for cut in ("micro1", "micro4", "tokens11", "tokens25"):
        _assert_same(minibatch_gradient(update, targets, loss_fn, mode, *CUTS[cut]), whole, f"{mode}, {cut}")


def test_token_budget_cuts_length_grouped_trimmed_micro_batches(policy):
    """Rows' tokens (prompt + response): 11 3 7 6 7 8 7 5. Budget 16, shortest first:
    [3 5 6] [7 7] [7 8] [11]. A trimmed micro-batch keeps only the columns its rows use;
    the padding fraction counts the slots its forwards still spent on padding."""
    update, targets, loss_fn = policy
    from algorithm.update_plan import UpdatePlan

    plan = UpdatePlan(1, 8, 8, seed=3, outer_iteration=1, micro_batch_tokens=16)
    (step,) = plan.steps(8, 0, 1, targets.attention_mask, targets.prompt_length)
    assert sorted(step.rows.tolist()) == list(range(8))  # the minibatch is unchanged
    lengths = targets.attention_mask.sum(dim=1)
    assert [lengths[m.rows].tolist() for m in step.micro_batches] == [[3, 5, 6], [7, 7], [7, 8], [11]]
    # Rows 1 (prompt 2, response 1), 7 (3, 2), 3 (4, 2): prompt columns 2.. of 5, response 2 of 6.
    first = step.micro_batches[0]
    assert (first.first_column, first.response_length) == (1, 2)
    ids, mask, prompt_length = first.sequences(targets.input_ids, targets.attention_mask, targets.prompt_length)
    assert ids.shape == (3, 6) and prompt_length == 4 and int(mask.sum()) == 14
    update.plan_shape = None  # the module's runtime measured other plans before
    metrics = update.run_plan(plan, targets, loss_fn)
    # 54 real tokens in 3·6 + 2·9 + 2·10 + 1·11 = 67 slots (each micro-batch as wide as its own rows).
    assert _slots(step, targets) == 67
    assert metrics["padding_fraction"] == pytest.approx(1 - 54 / 67, abs=1e-12)
    untrimmed = UpdatePlan(1, 8, 8, seed=3, outer_iteration=1)
    update.plan_shape = None
    assert update.run_plan(untrimmed, targets, loss_fn)["padding_fraction"] == pytest.approx(1 - 54 / 88, abs=1e-12)


def _slots(step, targets) -> int:
    return sum(
        micro.sequences(targets.input_ids, targets.attention_mask, targets.prompt_length)[1].numel()
        for micro in step.micro_batches
    )


def test_a_row_over_the_budget_is_refused_naming_it(policy):
    update, targets, loss_fn = policy
    with pytest.raises(RowTooLong, match=r"rl.micro_batch_tokens is 10, but row 0 of the batch holds 11 tokens"):
        minibatch_gradient(update, targets, loss_fn, "token_mean", 8, 10)


def test_two_ranks_give_the_one_rank_gradient(one_rank_gradients, tmp_path):
    """Two gloo ranks, each with half of every minibatch, sum to the one-rank gradient
    in every mode. With a budget of 16 tokens rank 0's half needs two micro-batches and
    rank 1's three: rank 0 splits one of its own, so both run three sharded forwards.
    About 9 s here (two spawned ranks), so it runs with the default suite."""
    cases = [[mode, cut] for mode in MODES for cut in ("micro2", "whole", "tokens16")]
    spawn(gradient_ranks, 2, tmp_path, {"cases": cases})
    for mode, cut in cases:
        got = load_file(tmp_path / f"{mode}-{cut}.safetensors")
        _assert_same(got, one_rank_gradients[mode], f"two ranks, {mode}, {cut}")


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean_token_mean"])
def test_the_ppo_options_terms_do_not_depend_on_the_cut_either(policy, one_rank_gradients, mode):
    """S-OPT-1 over S-PATH-2: clip-higher, the dual clip, the KL in the loss (k3), the
    entropy bonus and the engine-mismatch weight are per-token terms or factors of the one
    per-token loss, so they aggregate as it does; and they change the objective (else this
    could pass with them ignored)."""
    import dataclasses

    from algorithm.ppo_math import behaviour_weights

    update, targets, _ = policy
    generator = torch.Generator().manual_seed(11)
    reference = targets.old_logprobs + 0.2 * torch.randn(targets.old_logprobs.shape, generator=generator,
                                                         dtype=torch.float64) * targets.response_mask
    engine = targets.old_logprobs + 0.5 * torch.randn(targets.old_logprobs.shape, generator=generator,
                                                      dtype=torch.float64) * targets.response_mask
    weights, truncated = behaviour_weights(targets.old_logprobs, engine, targets.response_mask, cap=1.5)
    assert 0 < truncated.item() < 1
    with_reference = dataclasses.replace(targets, ref_logprobs=reference, kl_coef=0.1, behaviour_weights=weights)
    loss_fn = role_loss("policy", update.model, clip_ratio_high=0.28, dual_clip=1.5, entropy_coef=0.01,
                        kl_estimator="k3")
    whole = minibatch_gradient(update, with_reference, loss_fn, mode)
    assert not torch.allclose(whole["model.norm.weight"], one_rank_gradients[mode]["model.norm.weight"])
    for cut in ("micro1", "micro4", "tokens11", "tokens25"):
        _assert_same(minibatch_gradient(update, with_reference, loss_fn, mode, *CUTS[cut]), whole, f"{mode}, {cut}")


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean_token_mean"])
def test_the_reported_loss_and_diagnostics_do_not_depend_on_the_cut(policy, mode):
    """The metrics a user reads mean the same however the minibatch is cut: the loss is
    the aggregated objective, the diagnostics token means over the minibatch."""
    from algorithm.update_plan import UpdatePlan
    from tests.in_process.fsdp_ranks import GENERATION_BUDGET

    update, targets, loss_fn = policy
    reported = {}
    for cut, (micro_batch_size, tokens) in CUTS.items():
        update.plan_shape = None
        plan = UpdatePlan(1, 8, micro_batch_size, seed=3, outer_iteration=1, micro_batch_tokens=tokens,
                          loss_aggregation=mode, generation_budget=GENERATION_BUDGET)
        reported[cut] = update.run_plan(plan, targets, loss_fn)
    for cut, metrics in reported.items():
        for name in ("loss", "clip_fraction", "approx_kl", "ratio_mean", "entropy"):
            assert metrics[name] == pytest.approx(reported["whole"][name], rel=1e-6, abs=1e-12), (cut, name)
