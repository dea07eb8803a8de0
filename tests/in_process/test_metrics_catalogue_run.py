"""A real iteration loop's records against the metrics catalogue (issue 15): a key the
run writes but the catalogue does not list, or a key the catalogue promises for an
iteration that the record lacks, fails here instead of drifting silently.

In process on plain role objects (the tiny CPU profile, one rank of each role, one
engine), with one critic-warmup iteration and one where the actor updates."""

from __future__ import annotations

from algorithm.metrics_catalogue import (
    ACTOR_UPDATES,
    ADAPTIVE_KL,
    CLIP_HIGHER,
    DATA_PARALLEL,
    DUAL_CLIP,
    ENGINE_MISMATCH,
    EVERY_ITERATION,
    KL_IN_LOSS,
    METRICS,
    POLICY_PARKS,
    SEVERAL_ENGINES,
    WITH_CRITIC,
    WITH_MATCHER,
    keys_when,
    uncatalogued,
)
from flows.in_process import run_in_process
from configs.loading import load_config
from tests.conftest import TINY_PROFILE


def test_records_of_a_real_run_match_the_catalogue(tiny_overrides):
    config = load_config(TINY_PROFILE, tiny_overrides + ["rl.max_steps=2", "rl.critic_warmup_iterations=1"])
    (warmup, actor), _ = run_in_process(config)
    assert (warmup["train/actor_warmup"], actor["train/actor_warmup"]) == (1.0, 0.0)

    assert uncatalogued([warmup, actor]) == []
    # the profile has a terminal matcher and a critic (gae)
    always = keys_when(EVERY_ITERATION) | keys_when(WITH_MATCHER) | keys_when(WITH_CRITIC)
    assert always - warmup.keys() == set() and always - actor.keys() == set()
    # S-CW-6: the actor's metrics are absent while the critic warms up, present after.
    assert keys_when(ACTOR_UPDATES) & warmup.keys() == set()
    assert keys_when(ACTOR_UPDATES) - actor.keys() == set()
    # One rank, no park on CPU, one engine: keys reserved for those set-ups stay out.
    reserved = {m.key for m in METRICS if {DATA_PARALLEL, POLICY_PARKS, SEVERAL_ENGINES} & set(m.conditions)}
    assert reserved & (warmup.keys() | actor.keys()) == set()
    # The PPO options' keys appear only with their option on (S-OPT-1).
    option_conditions = {ADAPTIVE_KL, CLIP_HIGHER, DUAL_CLIP, KL_IN_LOSS, ENGINE_MISMATCH}
    options = {m.key for m in METRICS if option_conditions & set(m.conditions)}
    assert options & (warmup.keys() | actor.keys()) == set()


def test_the_ppo_options_keys_appear_with_their_options(tiny_overrides):
    config = load_config(TINY_PROFILE, tiny_overrides + [
        "rl.max_steps=2", "rl.critic_warmup_iterations=1", "rl.clip_ratio_high=0.28", "rl.dual_clip=3",
        "rl.kl_in=loss", "rl.kl_estimator=k3", "rl.kl_target=0.01", "rl.kl_horizon=1000", "rl.entropy_coef=0.001",
        "rl.rollout.engine_mismatch_cap=2",
    ])
    (warmup, actor), _ = run_in_process(config)
    assert uncatalogued([warmup, actor]) == []
    for condition in (ADAPTIVE_KL, ENGINE_MISMATCH):  # from prepare_batch: critic warmup included
        assert keys_when(condition) - warmup.keys() == set() and keys_when(condition) - actor.keys() == set()
    for condition in (CLIP_HIGHER, DUAL_CLIP, KL_IN_LOSS):
        assert keys_when(ACTOR_UPDATES, condition) - actor.keys() == set(), condition
        assert keys_when(ACTOR_UPDATES, condition) & warmup.keys() == set(), condition
