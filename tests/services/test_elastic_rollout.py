"""Elastic rollout (S-ELASTIC-1..3): with two rollout engines, an engine killed inside
`generate` costs its shard a regeneration on the survivor and a replacement engine; the
run goes on in the same flow run (no resume, no other role restarted) and ends with the
metrics rows, experience files and checkpoint files of its undisturbed twin.

The default suite kills engine 1 once against a twin made once per module; the other
engine, both transports, one step off, the hang and the bounds run under -m slow.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import TINY_PROFILE
from tests.support.elastic import assert_same_run, fault_inside_generate
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

    def twin(*extra: str):
        if extra not in made:
            root = tmp_path_factory.mktemp("twin")
            overrides = short_run_overrides(root / "outputs", tiny_model_dir) + TWO_ENGINES + ["job.name=twin", *extra]
            with keep_role_processes(role_process_pool):
                ppo(profile=TINY_PROFILE, overrides=overrides)
            made[extra] = root / "outputs" / "twin"
        return made[extra]

    return twin


def _killed_run(tiny_overrides, tmp_path, engine: int, iteration: int, *extra: str):
    from flows.training import ppo

    name = f"elastic-{engine}"
    fault = fault_inside_generate(name, engine, iteration, signal.SIGKILL)
    started = time.monotonic()
    summary = ppo(profile=TINY_PROFILE, overrides=_overrides(tiny_overrides, name, *extra))
    assert fault.armed.is_set() and fault.pid is not None
    return tmp_path / "outputs" / name, summary, time.monotonic() - started


@pytest.mark.parametrize("engine", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_an_engine_killed_inside_generate_costs_a_shard_and_the_run_ends_like_its_twin(
    engine, twins, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    run_dir, summary, seconds = _killed_run(tiny_overrides, tmp_path, engine, 2)
    print(f"\nengine {engine} killed inside generate of iteration 2: run took {seconds:.1f} s")
    assert summary["policy_version"] == 3 and not summary.get("resumed_from")  # the same flow run throughout
    rows = metric_records(run_dir)
    assert [r["fault/rollout_engines_lost"] for r in rows] == [0.0, 1.0, 0.0]
    assert rows[1]["fault/rollout_replace_seconds"] > 0 and rows[0]["fault/rollout_replace_seconds"] == 0.0
    assert all(r["rollout/engines"] == 2.0 for r in rows)
    assert_same_run(run_dir, twins())
