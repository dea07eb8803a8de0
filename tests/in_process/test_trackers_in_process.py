"""Trackers (issue 18 item 4, S-OPS-3): TensorBoard event files written beside
metrics.jsonl, read back with TensorBoard's own reader, and a resumed run that
continues the same curves without drawing any step twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.preflight import config_problems
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import metric_records


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


# W&B and MLflow are optional extras: these run where the package is installed
# (docs/prefect-ui.md names the versions exercised) and skip elsewhere.
KILLED_AT_3 = ["rl.max_steps=3", "rl.save_every=2", "rl.save_final=false", "rl.critic_warmup_iterations=1"]
RESUMED_TO_4 = ["rl.max_steps=4", "rl.save_every=2", "rl.critic_warmup_iterations=1"]


def _killed_and_resumed(tiny_overrides, tracker: str) -> Path:
    """Stopped after iteration 3 with its last boundary at 2, then resumed to 4: the
    tracker has seen step 3 once already, and sees it again."""
    chosen = f'job.trackers=["{tracker}"]'
    run_dir = _run(tiny_overrides, tracker, chosen, *KILLED_AT_3)
    _run(tiny_overrides, tracker, chosen, *RESUMED_TO_4)
    return run_dir


def test_mlflow_holds_every_metrics_key_once_per_iteration_after_a_resume_that_replays_a_step(tiny_overrides):
    pytest.importorskip("mlflow")
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    run_dir = _killed_and_resumed(tiny_overrides, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlflow.db")
    experiment = client.get_experiment_by_name("ppo").experiment_id
    (run,) = client.search_runs([experiment], run_view_type=ViewType.ACTIVE_ONLY)  # the killed attempt's is deleted
    history = {
        key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
        for key in run.data.metrics
    }
    assert _close(history, _expected(run_dir))  # step 3 once, with the rerun's values
    assert history["train/actor_warmup"] == [(1, 1.0), (2, 0.0), (3, 0.0), (4, 0.0)]


def test_mlflow_run_extended_from_its_final_boundary_stays_one_run(tiny_overrides):
    """Nothing is replayed when a finished run is extended, so no copy is made."""
    pytest.importorskip("mlflow")
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    run_dir = _run(tiny_overrides, "extended", 'job.trackers=["mlflow"]', "rl.max_steps=2")
    _run(tiny_overrides, "extended", 'job.trackers=["mlflow"]', "rl.max_steps=4")
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlflow.db")
    experiment = client.get_experiment_by_name("ppo").experiment_id
    (run,) = client.search_runs([experiment], run_view_type=ViewType.ALL)  # none deleted
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/actor_warmup")]
    assert sorted(steps) == [1, 2, 3, 4]


def _wandb_history(run_file: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars of one offline run, read from its .wandb file: a 7-byte file header,
    then LevelDB-log blocks of 32 KiB whose record fragments carry a 7-byte header
    (crc32, length, type: 1 whole, 2 first, 3 middle, 4 last); each record is a
    wandb.proto Record."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    raw = run_file.read_bytes()
    assert raw[:4] == b":W&B", "not a .wandb file"
    records, pending, position = [], b"", 7
    while position + 7 <= len(raw):
        left_in_block = 32768 - position % 32768
        _, length, kind = struct.unpack("<IHB", raw[position : position + 7]) if left_in_block >= 7 else (0, 0, 0)
        if kind == 0:  # block padding
            position += left_in_block
            continue
        fragment, position = raw[position + 7 : position + 7 + length], position + 7 + length
        pending = fragment if kind in (1, 2) else pending + fragment
        if kind in (1, 4):
            records.append(pending)
    history: dict[str, list[tuple[int, float]]] = {}
    for data in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = items.pop("_step")
            for key, value in items.items():
                if not key.startswith("_"):
                    history.setdefault(key, []).append((step, float(value)))
    return history


def test_wandb_offline_run_left_to_sync_holds_every_metrics_key_once_per_iteration_after_a_resume(tiny_overrides):
    pytest.importorskip("wandb")
    run_dir = _killed_and_resumed(tiny_overrides, "wandb")
    (to_sync,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")  # what `wandb sync <run>/wandb` uploads
    (earlier,) = (run_dir / "wandb" / "earlier_attempts").glob("offline-run-*/run-*.wandb")  # kept aside
    history = _wandb_history(to_sync)
    assert _close(history, _expected(run_dir))  # the whole curve, step 3 once
    assert history["train/actor_warmup"] == [(1, 1.0), (2, 0.0), (3, 0.0), (4, 0.0)]
    assert [step for step, _ in _wandb_history(earlier)["train/actor_warmup"]] == [1, 2, 3]
