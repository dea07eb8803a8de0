"""Elastic rollout (S-ELASTIC-1..3): with two rollout engines, an engine killed inside
`generate` costs its shard a regeneration on the survivor and a replacement engine; the
run goes on in the same flow run (no resume, no other role restarted) and ends with the
metrics rows, experience files and checkpoint files of its undisturbed twin.

The default suite kills engine 1 once against a twin made once per module; the other
engine, both transports, one step off, several samples per prompt, the hang and the
bounds run under -m slow.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.conftest import TINY_PROFILE
from tests.support.elastic import assert_same_run, fault_inside_generate, release
from tests.support.helpers import metric_records

TWO_ENGINES = ["grid.cpu_rollout_engines=2", "rl.max_steps=3", "rl.save_every=2"]


def _overrides(tiny_overrides: list[str], name: str, *extra: str) -> list[str]:
    return tiny_overrides + TWO_ENGINES + [f"job.name={name}", *extra]


@pytest.fixture(scope="module")
def twins(prefect_api, ray_cluster, role_process_pool, tiny_model_dir, tmp_path_factory):
    """Undisturbed runs, one per variant, made on first use and shared by the module."""
    from flows.training import ppo
    from tests.conftest import short_run_overrides
    from tests.support.process_pool import keep_role_processes

    made: dict[tuple[str, ...], object] = {}

    def twin(*extra: str, profile: str = TINY_PROFILE):
        if extra not in made:
            root = tmp_path_factory.mktemp("twin")
            overrides = short_run_overrides(root / "outputs", tiny_model_dir) + TWO_ENGINES + ["job.name=twin", *extra]
            with keep_role_processes(role_process_pool):
                ppo(profile=profile, overrides=overrides)
            made[extra] = root / "outputs" / "twin"
        return made[extra]

    return twin


def _killed_run(tiny_overrides, tmp_path, engine: int, iteration: int, *extra: str, profile: str = TINY_PROFILE):
    from flows.training import ppo

    name = f"elastic-{engine}"
    fault = fault_inside_generate(name, engine, iteration, signal.SIGKILL)
    started = time.monotonic()
    summary = ppo(profile=profile, overrides=_overrides(tiny_overrides, name, *extra))
    assert fault.armed.is_set() and fault.pid is not None
    return tmp_path / "outputs" / name, summary, time.monotonic() - started


@pytest.mark.parametrize("engine", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_an_engine_killed_inside_generate_costs_a_shard_and_the_run_ends_like_its_twin(
    engine, twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path, caplog
):
    run_dir, summary, seconds = _killed_run(tiny_overrides, tmp_path, engine, 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "lost rollout" in r.getMessage()]
    assert len(warnings) == 1, warnings
    survivor = 1 - engine
    assert re.match(
        rf"lost rollout engine {engine} on node \w+ \(.*\): its process is gone .*; iteration 2: shard {engine} of 2 "
        rf"generated again on rollout engine {survivor} \([0-9.]+ s into the shard\), done after [0-9.]+ s more",
        warnings[0],
    ), warnings[0]
    # The replacement starts while iteration 2 trains and takes iteration 2's weights in its
    # weight sync; the rollout task of iteration 3 says so.
    serving = [r for r in caplog.records if f"replacement rollout engine {engine} is serving" in r.getMessage()]
    assert len(serving) == 1 and "policy_version 2 on node" in serving[0].getMessage(), serving
    print(f"\nengine {engine} killed inside generate of iteration 2: run took {seconds:.1f} s")
    assert summary["policy_version"] == 3 and not summary.get("resumed_from")  # the same flow run throughout
    # No other role restarted: the role actors were started once (a resume starts them all again).
    launches = [r.getMessage() for r in caplog.records if r.getMessage().startswith("actors: ")]
    assert len(launches) == 1, launches
    rows = metric_records(run_dir)
    assert [r["fault/rollout_engines_lost"] for r in rows] == [0.0, 1.0, 0.0]
    assert [r["fault/rollout_replace_seconds"] > 0 for r in rows] == [False, False, True]
    assert all(r["rollout/engines"] == 2.0 for r in rows)
    assert_same_run(run_dir, twins())


# -m slow: the exactness matrix (S-ELASTIC-1: both transports, synchronous and one step
# off, engine 0 and engine k>0), a kill at a random moment, the hang, and the bounds.
NIXL = ["grid.gpu_placement=disaggregated", "rl.weight_sync_transport=nixl", "rl.rollout.weight_sync_bucket_mib=0.05"]
ONE_STEP_OFF = ["rl.rollout.max_staleness=1"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", [0, 1])
@pytest.mark.parametrize("transport", ["object_store", "nixl"])
@pytest.mark.parametrize("staleness", [0, 1])
def test_exact_after_a_kill_inside_generate_for_each_transport_and_staleness(
    engine, transport, staleness, twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    """One step off, iteration 3's batch is generated while iteration 2 trains and is
    the in-flight batch boundary 2 holds: the kill hits exactly that generation."""
    extra = tuple((NIXL if transport == "nixl" else []) + (ONE_STEP_OFF if staleness else []))
    at = 3 if staleness else 2
    run_dir, summary, seconds = _killed_run(tiny_overrides, tmp_path, engine, at, *extra)
    print(f"\nengine {engine}, {transport}, staleness {staleness}, iteration {at}: {seconds:.1f} s")
    assert summary["policy_version"] == 3 and not summary.get("resumed_from")
    lost = [r["fault/rollout_engines_lost"] for r in metric_records(run_dir)]
    assert lost == [0.0] * (at - 1) + [1.0] + [0.0] * (3 - at)
    assert_same_run(run_dir, twins(*extra))


@pytest.mark.slow
def test_exact_after_a_kill_with_a_normalised_reward_model(
    twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tiny_reward_model_dir, tmp_path
):
    """S-RM-2 with S-ELASTIC-1: the regenerated shard is scored by the reward model like
    the lost one, so the running normalisation and every file match the twin's."""
    extra = (f"rl.reward.model.path={tiny_reward_model_dir}", "rl.reward.model.normalize=true",
             "rl.reward.model.max_length=64")
    run_dir, summary, _ = _killed_run(tiny_overrides, tmp_path, 1, 2, *extra)
    rows = metric_records(run_dir)
    assert [r["fault/rollout_engines_lost"] for r in rows] == [0.0, 1.0, 0.0]
    assert all("reward/model_normalized_mean" in r for r in rows)
    assert_same_run(run_dir, twins(*extra))


@pytest.mark.slow
def test_exact_after_a_kill_with_several_samples_per_prompt(
    twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    """S-OPT-2 with S-ELASTIC-1: the lost shard is whole prompts with all their samples;
    the survivor draws them again from the same stream, so every file matches the twin's
    and each prompt's two samples still sit side by side under one group id."""
    import gzip
    import json

    extra = ("rl.rollout.samples_per_prompt=2",)
    run_dir, summary, _ = _killed_run(tiny_overrides, tmp_path, 1, 2, *extra)
    assert [r["fault/rollout_engines_lost"] for r in metric_records(run_dir)] == [0.0, 1.0, 0.0]
    with gzip.open(run_dir / "experience" / "iter_000002.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line in handle]
    assert [row["group"] for row in rows] == [group for group in range(16) for _ in range(2)]
    assert [row["row_id"] for row in rows[0::2]] == [row["row_id"] for row in rows[1::2]]
    assert_same_run(run_dir, twins(*extra))


@pytest.mark.slow
def test_exact_after_a_kill_in_a_multi_turn_run(
    twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path, monkeypatch
):
    """S-ENV-3 with S-ELASTIC-1: the survivor regenerates the lost shard's episodes with
    the same environment seeds and sampling streams, so every file matches the twin's."""
    from pathlib import Path

    from tests.conftest import TRUSTING_TINY_PROFILE

    monkeypatch.setenv("PPO_PROFILE_DIRS", str(Path(TRUSTING_TINY_PROFILE).parent))  # the test is the operator
    extra = ("rl.env.factory=tests.in_process.test_episodes:CountingEnv", "rl.env.max_turns=3",
             "rl.env.max_turn_tokens=12", "rl.env.max_episode_tokens=60")
    run_dir, summary, _ = _killed_run(tiny_overrides, tmp_path, 1, 2, *extra, profile=TRUSTING_TINY_PROFILE)
    rows = metric_records(run_dir)
    assert [r["fault/rollout_engines_lost"] for r in rows] == [0.0, 1.0, 0.0]
    assert all(r["env/turns_mean"] >= 1.0 for r in rows)
    assert_same_run(run_dir, twins(*extra, profile=TRUSTING_TINY_PROFILE))


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["object_store", "nixl"])
def test_a_kill_at_a_random_moment_ends_like_the_twin(
    transport, twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    """Engine 1 SIGKILLed at a moment drawn at random during the run: in generate, in a
    weight load, or idle between calls; whichever call meets the dead engine next
    replaces it."""
    import random
    import threading

    import ray

    from flows.training import ppo
    from tests.support.helpers import run_actor

    extra = tuple(NIXL if transport == "nixl" else [])
    name = f"random-{transport}"
    steps = 5
    moment = random.Random().uniform(0.0, 1.0)
    hit = {}

    def kill_later():
        rows = tmp_path / "outputs" / name / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if rows.exists() and rows.read_text().strip():  # iteration 1 done: every engine holds weights
                time.sleep(moment)
                handle = run_actor(name, "rollout-rank1")
                hit["rows"] = len(rows.read_text().splitlines())
                hit["pid"] = ray.get(handle.__ray_call__.remote(lambda self: __import__("os").getpid()))
                __import__("os").kill(hit["pid"], signal.SIGKILL)
                return
            time.sleep(0.05)

    threading.Thread(target=kill_later, daemon=True).start()
    overrides = _overrides(tiny_overrides, name, *extra) + [f"rl.max_steps={steps}"]
    summary = ppo(profile=TINY_PROFILE, overrides=overrides)
    print(f"\nengine 1 killed {moment:.2f} s after iteration 1's row, {hit.get('rows')} rows written ({transport})")
    assert hit.get("pid") and not summary.get("resumed_from")
    rows = metric_records(tmp_path / "outputs" / name)
    lost = sum(r["fault/rollout_engines_lost"] for r in rows)
    # Killed before the second-last row, the last iteration's generate at least meets the dead engine.
    assert lost == 1.0 if hit["rows"] <= steps - 2 else lost <= 1.0, (lost, hit)
    assert_same_run(tmp_path / "outputs" / name, twins(*extra, f"rl.max_steps={steps}"))


@pytest.mark.slow
def test_an_engine_killed_inside_its_weight_load_is_replaced_before_the_next_rollout(
    twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path, caplog
):
    """A loss outside generate (here in iteration 2's weight sync) costs no shard: the
    replacement takes the version at the pool's next call and the loss is reported with
    the next batch."""
    from flows.training import ppo
    from tests.support.elastic import fault_inside_load_weights

    name = "elastic-load"
    fault = fault_inside_load_weights(name, 1, 2, signal.SIGKILL)
    summary = ppo(profile=TINY_PROFILE, overrides=_overrides(tiny_overrides, name))
    assert fault.armed.is_set() and not summary.get("resumed_from")
    rows = metric_records(tmp_path / "outputs" / name)
    assert [r["fault/rollout_engines_lost"] for r in rows] == [0.0, 0.0, 1.0]
    assert rows[2]["fault/rollout_replace_seconds"] > 0
    assert any("replacement rollout engine 1 is serving policy_version 2" in r.getMessage() for r in caplog.records)
    assert_same_run(tmp_path / "outputs" / name, twins())


@pytest.mark.slow
def test_a_hung_engine_is_found_within_its_deadline_killed_named_and_replaced(
    twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path, caplog
):
    from flows.training import ppo
    from tests.support.helpers import alive

    name = "elastic-hang"
    engine_timeout = 5
    fault = fault_inside_generate(name, 1, 2, signal.SIGSTOP)
    try:
        ppo(profile=TINY_PROFILE, overrides=_overrides(
            tiny_overrides, name, f"rl.rollout.engine_timeout_seconds={engine_timeout}"))
        lost = [r.getMessage() for r in caplog.records if "lost rollout engine 1" in r.getMessage()]
        assert lost and f"no answer within {engine_timeout} s (rl.rollout.engine_timeout_seconds)" in lost[0], lost
        shard = re.search(r"\(([0-9.]+) s into the shard\)", lost[0])
        assert shard and engine_timeout <= float(shard.group(1)) < engine_timeout + 5, lost[0]
        deadline = time.monotonic() + 30
        while alive(fault.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(fault.pid)  # killed, not left stopped
        assert_same_run(tmp_path / "outputs" / name, twins())
    finally:
        release(fault.pid)


@pytest.mark.slow
def test_without_elasticity_a_hung_engine_k_is_the_one_named_and_killed(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    """Before, engine 0 (whose gather waits for every shard) was named and killed."""
    from flows.failures import StageFailed
    from flows.training import ppo

    name = "inelastic-hang"
    fault = fault_inside_generate(name, 1, 2, signal.SIGSTOP)
    overrides = _overrides(tiny_overrides, name, "rl.rollout.max_engine_replacements=0", "rl.stage_timeout_seconds=10")
    try:
        with pytest.raises(StageFailed) as caught:
            ppo(profile=TINY_PROFILE, overrides=overrides)
        assert str(caught.value).startswith("rollout[iter=2] failed: StageTimeout: no result from the rollout rank 1 "
                                            "actor within 10 s"), str(caught.value)
        rows = metric_records(tmp_path / "outputs" / name)
        assert not any(key.startswith("fault/") for key in rows[0])  # elasticity off: no fault keys, no fleet
    finally:
        release(fault.pid)


@pytest.mark.slow
def test_losing_more_engines_than_the_bound_fails_the_stage_by_name(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.failures import StageFailed
    from flows.training import ppo

    name = "elastic-bound"
    fault_inside_generate(name, 1, 1, signal.SIGKILL)
    fault_inside_generate(name, 0, 2, signal.SIGKILL)
    with pytest.raises(StageFailed) as caught:
        ppo(profile=TINY_PROFILE, overrides=_overrides(tiny_overrides, name, "rl.rollout.max_engine_replacements=1"))
    assert re.match(
        r"rollout\[iter=2\] failed: RolloutEngineLost: lost rollout engine 0 on node .*: its process is gone .*; "
        r"the run has already replaced 1 engine\(s\) \(rl.rollout.max_engine_replacements=1\)", str(caught.value)
    ), str(caught.value)


@pytest.mark.slow
def test_losing_every_engine_fails_the_stage_by_name(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.failures import StageFailed
    from flows.training import ppo

    name = "elastic-all"
    fault_inside_generate(name, 0, 2, signal.SIGKILL)
    fault_inside_generate(name, 1, 2, signal.SIGKILL)
    with pytest.raises(StageFailed) as caught:
        ppo(profile=TINY_PROFILE, overrides=_overrides(tiny_overrides, name))
    assert re.match(r"rollout\[iter=2\] failed: RolloutEngineLost: every rollout engine is lost \(2 of 2\)",
                    str(caught.value)), str(caught.value)


@pytest.mark.slow
def test_without_elasticity_a_killed_engine_k_fails_the_stage_named_as_any_actor(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    """rl.rollout.max_engine_replacements=0: the pool replaces nothing and passes the
    engine's own failure on, which the runner names by role and rank (S-FAULT-1)."""
    from flows.failures import StageFailed
    from flows.training import ppo

    name = "inelastic-kill"
    fault_inside_generate(name, 1, 2, signal.SIGKILL)
    with pytest.raises(StageFailed) as caught:
        ppo(profile=TINY_PROFILE, overrides=_overrides(tiny_overrides, name, "rl.rollout.max_engine_replacements=0"))
    assert re.match(r"rollout\[iter=2\] failed: \w+Error: the rollout rank 1 actor .*is gone", str(caught.value)), (
        str(caught.value)
    )
    rows = metric_records(tmp_path / "outputs" / name)
    assert not any(key.startswith("fault/") for key in rows[0])
