"""Held-out evaluation (issue 18 item 2, S-OPS-2) through the in-process runner: the
flow's own iteration program on role objects, seconds per case.

The promise that matters most: evaluating never changes training. Weights and every
train/* metric of a run that evaluates after every iteration (greedy, and sampled,
whose draws must not touch the rollout's sampling stream) equal those of a run that
never evaluates."""

from __future__ import annotations

import pytest

from algorithm.metrics_catalogue import EVALUATIONS, WITH_MATCHER, WITH_REFERENCES, keys_when, uncatalogued
from checkpoint.digest import state_digest
from checkpoint.role_state import model_tensors
from configs.loading import ConfigError, load_config
from flows.in_process import run_in_process
from tests.conftest import TINY_PROFILE

EVALUATION = ["rl.validation.data.factory=data.synthetic:each_digit", "rl.validation.data.shuffle=false"]


def _config(tiny_overrides, *extra: str):
    return load_config(TINY_PROFILE, tiny_overrides + ["rl.max_steps=3", *extra])


def _training(record: dict) -> dict:
    """What training computed: no evaluation keys, no wall-clock figures."""
    return {k: v for k, v in record.items() if not k.startswith(("val/", "time/")) and not k.endswith("_seconds")}


@pytest.mark.parametrize("greedy", [True, False])
def test_evaluating_after_every_iteration_changes_no_weight_and_no_training_metric(tiny_overrides, greedy):
    evaluated, evaluating_roles = run_in_process(_config(
        tiny_overrides, *EVALUATION, "rl.validation.every=1", "rl.validation.before_training=true",
        f"rl.validation.greedy={str(greedy).lower()}",
    ))
    plain, plain_roles = run_in_process(_config(tiny_overrides))

    assert [r["iteration"] for r in evaluated] == [0, 1, 2, 3]  # iteration 0: the starting policy
    assert [_training(r) for r in evaluated[1:]] == [_training(r) for r in plain]
    for role in ("policy", "critic"):
        assert state_digest(model_tensors(getattr(evaluating_roles, role).model)) == state_digest(
            model_tensors(getattr(plain_roles, role).model)
        ), role
    # Every evaluation row carries the catalogue's val/* keys, and nothing uncatalogued.
    promised = keys_when(EVALUATIONS) | keys_when(EVALUATIONS, WITH_MATCHER) | keys_when(EVALUATIONS, WITH_REFERENCES)
    assert uncatalogued(evaluated) == []
    assert all(promised <= record.keys() for record in evaluated)
    assert set(evaluated[0]) == promised | {"iteration"}  # row 0 is the evaluation alone
    assert [r["val/policy_version"] for r in evaluated] == [0.0, 1.0, 2.0, 3.0]  # the current policy each time
    assert all(r["val/prompts"] == 10.0 for r in evaluated)  # each digit once
    assert all(0.0 <= r["val/exact_match"] <= 1.0 for r in evaluated)


def test_evaluation_follows_its_cadence_and_is_repeatable(tiny_overrides):
    extra = (*EVALUATION, "rl.validation.every=2", "rl.validation.before_training=false", "rl.max_steps=4")
    first, _ = run_in_process(_config(tiny_overrides, *extra))
    again, _ = run_in_process(_config(tiny_overrides, *extra))
    assert [r["iteration"] for r in first] == [1, 2, 3, 4]
    assert [("val/reward_mean" in r) for r in first] == [False, True, False, True]
    assert [("time/evaluate_seconds" in r) for r in first] == [False, True, False, True]
    def scores(records: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k.startswith("val/") and not k.endswith("_seconds")} for r in records]

    assert scores(first) == scores(again)  # greedy: the same numbers every time


def test_evaluation_that_would_never_run_or_has_no_data_is_refused_naming_the_key(tiny_overrides):
    with pytest.raises(ConfigError, match=r"rl.validation.every is 0 and rl.validation.before_training is false"):
        _config(tiny_overrides, *EVALUATION, "rl.validation.every=0", "rl.validation.before_training=false")
    with pytest.raises(ConfigError, match=r"rl.validation.data: Field required"):
        _config(tiny_overrides, "rl.validation.every=5")
    with pytest.raises(ConfigError, match=r"rl.validation.num_prompts"):
        _config(tiny_overrides, *EVALUATION, "rl.validation.num_prompts=0")
