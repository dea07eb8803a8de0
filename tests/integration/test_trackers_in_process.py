"""Trackers (issue 18 item 4, S-OPS-3): TensorBoard event files written beside
metrics.jsonl, read back with TensorBoard's own reader, and a resumed run that
continues the same curves without drawing any step twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.loading import load_config
from flows.in_process import run_in_process
from flows.preflight import config_problems
from flows.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.integration.helpers import metric_records


def _run(tiny_overrides, name: str, *extra: str) -> Path:
    config = load_config(TINY_PROFILE, tiny_overrides + [f"job.name={name}", "job.experience.keep=off", *extra])
    run_in_process(config, paths=RunPaths.for_config(config), resume=True)
    return Path(config.job.output_root) / name


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _expected(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in metric_records(run_dir):
        for key, value in record.items():
            if key != "iteration":
                expected.setdefault(key, []).append((record["iteration"], value))
    return expected


def _close(got: dict, expected: dict) -> bool:
    """Event files store float32."""
    return got.keys() == expected.keys() and all(
        [step for step, _ in got[k]] == [step for step, _ in expected[k]]
        and all(v == pytest.approx(w, rel=1e-6, abs=1e-12) for (_, v), (_, w) in zip(got[k], expected[k]))
        for k in expected
    )


def test_every_metrics_key_is_a_tensorboard_scalar_stepped_by_iteration_and_resume_draws_each_step_once(
    tiny_overrides,
):
    evaluation = ["rl.validation.data.factory=data.synthetic:each_digit", "rl.validation.every=2",
                  "rl.critic_warmup_iterations=1"]
    # Stopped after iteration 3 with its last boundary at 2: the rerun redoes 3.
    run_dir = _run(tiny_overrides, "tb", "rl.max_steps=3", "rl.save_every=2", "rl.save_final=false", *evaluation)
    _run(tiny_overrides, "tb", "rl.max_steps=4", "rl.save_every=2", *evaluation)
    scalars = _scalars(run_dir)
    assert _close(scalars, _expected(run_dir))  # each key, each step once, metrics.jsonl's values
    assert [step for step, _ in scalars["val/reward_mean"]] == [0, 2, 4]  # before training, then every 2
    assert scalars["train/actor_warmup"] == [(1, 1.0), (2, 0.0), (3, 0.0), (4, 0.0)]  # warmup marked


def test_a_tracker_chosen_but_not_installed_is_refused_naming_the_key(tiny_overrides, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    config = load_config(TINY_PROFILE, tiny_overrides + ['job.trackers=["tensorboard", "wandb"]'])
    problems = [str(problem) for problem in config_problems(config)]
    assert any(p.startswith("job.trackers: lists wandb, but the package is not installed") for p in problems), problems
    with pytest.raises(Exception, match="job.trackers"):
        load_config(TINY_PROFILE, tiny_overrides + ['job.trackers=["comet"]'])
