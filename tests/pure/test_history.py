"""Run history in the Prefect UI: artifact keys, the iteration table, the progress and
summary artifacts, and the reward/KL curve (issue 8), built without a Prefect API;
tests/services/test_history_artifacts.py reads them back through a real one."""

from __future__ import annotations

import json
import re
import uuid

from rundir.run_outputs import append_metrics
from tests.support.metrics_rows import iteration_metrics
from views.curves import curve_points, write_reward_curve
from views.history import RunHistory, artifact_key, iteration_row, summary_markdown, table_rows


def test_artifact_keys_use_only_the_alphabet_prefect_accepts_and_keep_distinct_runs_apart():
    assert artifact_key("tiny-cpu", "iterations") == "ppo-tiny-cpu-iterations"
    odd = artifact_key("My_Run 1.5", "summary")
    assert re.fullmatch(r"[a-z0-9-]+", odd), odd
    assert odd.startswith("ppo-my-run-1-5-") and odd.endswith("-summary")
    # "My_Run" and "my-run" sanitise to the same slug; the hash keeps their histories apart.
    assert artifact_key("My_Run", "iterations") != artifact_key("my-run", "iterations")
    assert re.fullmatch(r"[a-z0-9-]+", artifact_key("___", "progress"))


def test_iteration_row_names_columns_in_stage_order_and_leaves_missing_metrics_empty():
    row = iteration_row(iteration_metrics(1, 0.0625, 0.0, warmup=True, version=0))
    assert row == {
        "iteration": 1,
        "reward_mean": 0.0625,
        "kl": 0.0,
        "policy_loss": None,  # no actor update during critic warmup: empty, not 0
        "value_loss": 0.05,
        "policy_version": 0,
        "actor_warmup": True,
        "data_s": 0.01,
        "rollout_s": 0.1235,  # 0.123456 to 4 significant digits
        "train_s": 0.5,
        "iteration_s": 0.9,
    }
    # A later iteration with weight_sync: every row gets every column.
    rows = table_rows([row, iteration_row(iteration_metrics(2, 0.1, 0.001))])
    assert list(rows[0]) == list(rows[1]) and rows[0]["weight_sync_s"] is None and rows[1]["weight_sync_s"] == 0.02


def test_reward_curve_is_a_png_drawn_from_the_latest_line_of_each_iteration(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    # Iteration 2 ran twice (a crash after it, then a resume from boundary 1): the later line counts.
    for record in (
        iteration_metrics(1, 0.1, 0.0, warmup=True),
        iteration_metrics(2, 0.9, 0.5),
        iteration_metrics(2, 0.2, 0.01),
        iteration_metrics(3, 0.3, 0.02),
    ):
        append_metrics(str(metrics), record)
    points = curve_points([json.loads(line) for line in metrics.read_text().splitlines()])
    assert points.iterations == [1, 2, 3] and points.reward_mean == [0.1, 0.2, 0.3]
    assert points.actor_warmup == [True, False, False]

    out = write_reward_curve(str(metrics), str(tmp_path / "reward_curve.png"), "probe")
    assert out == str(tmp_path / "reward_curve.png")
    from matplotlib.image import imread

    image = imread(out)
    assert image.shape[:2] == (500, 800)  # figsize (8, 5) at 100 dpi
    assert write_reward_curve(str(tmp_path / "missing.jsonl"), str(tmp_path / "none.png")) is None
    assert not (tmp_path / "none.png").exists()


def test_summary_markdown_names_iterations_boundary_reward_model_and_curve():
    records = [iteration_metrics(1, 0.1, 0.0), iteration_metrics(2, 0.75, 0.0123)]
    summary = {
        "run_name": "probe",
        "run_dir": "/runs/probe",
        "iterations": 2,
        "policy_version": 2,
        "last_boundary": "/runs/probe/checkpoints/iter_000002",
        "final_model": {"policy": "/runs/probe/final_model/policy"},
        "first_reward_mean": 0.1,
        "last_reward_mean": 0.75,
        "reward_window": 2,
    }
    text = summary_markdown(summary, records, "/runs/probe/reward_curve.png", b"\x89PNG fake")
    assert "| iterations done | 2 / 2 |" in text
    assert "`/runs/probe/checkpoints/iter_000002`" in text
    assert "| final reward mean (iteration 2) | 0.7500 |" in text
    assert "| exported policy model | `/runs/probe/final_model/policy` |" in text
    assert "[/runs/probe/reward_curve.png](file:///runs/probe/reward_curve.png)" in text
    assert "data:image/png;base64," in text


def _recorded_writes(monkeypatch) -> tuple[list[tuple[str, int, int]], dict[str, int]]:
    """Every history write (what, the iteration it went out after, the bytes it
    carried), the API replaced by a recorder, and the clock the caller sets."""
    writes: list[tuple[str, int, int]] = []
    now = {"iteration": 0}
    monkeypatch.setattr(RunHistory, "_update", lambda self, what, artifact_id, update: writes.append(
        (what, now["iteration"], len(update.model_dump_json(exclude_unset=True)))
    ))
    monkeypatch.setattr("views.history.update_progress_artifact", lambda artifact_id, progress, description: (
        writes.append(("progress", now["iteration"], len(json.dumps([progress, description]))))
    ))
    return writes, now


def test_what_an_iteration_sends_costs_the_same_at_iteration_3000_as_at_iteration_300(monkeypatch):
    """S-FOOT-1: per iteration at most the progress goes out; the run's table (its newest
    TABLE_WINDOW rows) every TABLE_EVERY iterations and at each commit, so the bytes
    sent per 1,000 iterations stay the same however long the run (before, the whole
    window went out every iteration: 38 KB an iteration once full)."""
    from views.artifact_writes import artifact_writes
    from views.history import PROGRESS_EVERY_S, TABLE_EVERY, TABLE_WINDOW

    writes, clock = _recorded_writes(monkeypatch)
    seconds = {"now": 0.0}
    monkeypatch.setattr("views.history.time.monotonic", lambda: seconds["now"])
    history = RunHistory(
        run_name="long", max_steps=3000, commit_every=25, table_id=uuid.uuid4(), progress_id=uuid.uuid4()
    )
    for iteration in range(1, 3001):
        clock["iteration"] = iteration
        seconds["now"] += PROGRESS_EVERY_S  # iterations as slow as the progress's pace: each one sent
        history.add_iteration(iteration_metrics(iteration, 0.1, 0.0))
        artifact_writes().flush()  # each write sent before the next (unsent ones would coalesce)
    tables = [(i, size) for what, i, size in writes if what == "update the iteration table"]
    assert [i for i, _ in tables] == [i for i in range(1, 3001) if i % TABLE_EVERY == 0 or i % 25 == 0]
    progress = [size for what, _, size in writes if what == "progress"]
    assert len(progress) == 3000 and max(progress) < 100  # one number and a short line
    assert [row["iteration"] for row in history.rows] == list(range(3001 - TABLE_WINDOW, 3001))

    def sent(first: int, last: int) -> int:
        return sum(size for _, i, size in writes if first <= i <= last)

    assert sent(2001, 3000) <= 1.01 * sent(1001, 2000)
    assert sent(1001, 2000) / 1000 < 6_000  # bytes per iteration, the window full


def test_a_blocks_table_goes_out_once_when_the_block_ends_on_that_blocks_run(monkeypatch):
    """S-FOOT-1: a block's table is created once, at its end, on the block's own flow
    run; the run's table goes out then too with the rows not yet sent."""
    from views.artifact_writes import artifact_writes

    created: list[tuple[object, list[int]]] = []
    updated: list[list[int]] = []
    monkeypatch.setattr("views.history.create_artifact", lambda artifact: created.append(
        (artifact.flow_run_id, [row["iteration"] for row in artifact.table])
    ) or type("Created", (), {"id": uuid.uuid4()})())
    monkeypatch.setattr(RunHistory, "_update", lambda self, what, artifact_id, update: updated.append(
        [row["iteration"] for row in json.loads(update.data)]
    ))
    monkeypatch.setattr("views.history.update_progress_artifact", lambda *args, **kwargs: None)
    run, first_block, second_block = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    inside = {"block": first_block}
    monkeypatch.setattr("views.history.current_flow_run_id", lambda: inside["block"])
    history = RunHistory(run_name="blocks", max_steps=30, flow_run_id=run, table_id=uuid.uuid4(),
                         progress_id=uuid.uuid4())
    for iteration in range(1, 8):
        history.add_iteration(iteration_metrics(iteration, 0.1, 0.0))
    artifact_writes().flush()
    assert created == [] and updated == []  # nothing table-sized went out during the block
    history.end_block()
    artifact_writes().flush()
    assert created == [(first_block, list(range(1, 8)))] and updated == [list(range(1, 8))]
    inside["block"] = second_block
    for iteration in range(8, 13):
        history.add_iteration(iteration_metrics(iteration, 0.1, 0.0))
    history.send_unsent()
    artifact_writes().flush()
    assert created[-1] == (second_block, list(range(8, 13)))
    assert updated[0] == list(range(1, 8)) and updated[-1] == list(range(1, 13))


def test_fast_iterations_send_the_progress_every_few_seconds_and_with_every_table(monkeypatch):
    """S-FOOT-1: iterations faster than PROGRESS_EVERY_S send the progress at that pace,
    with each table, and the last iteration's at the block's end: the UI is never more
    than a few seconds behind, and the API is not asked for an update per iteration."""
    from views.artifact_writes import artifact_writes
    from views.history import PROGRESS_EVERY_S, TABLE_EVERY

    writes, clock = _recorded_writes(monkeypatch)
    seconds = {"now": 0.0}
    monkeypatch.setattr("views.history.time.monotonic", lambda: seconds["now"])
    history = RunHistory(run_name="fast", max_steps=100, table_id=uuid.uuid4(), progress_id=uuid.uuid4())
    history.progress_sent_at = 0.0
    for iteration in range(1, 28):
        clock["iteration"] = iteration
        seconds["now"] += PROGRESS_EVERY_S / 4
        history.add_iteration(iteration_metrics(iteration, 0.1, 0.0))
        artifact_writes().flush()
    sent = [i for what, i, _ in writes if what == "progress"]
    assert sent == [4, 8, TABLE_EVERY, 14, 18, 2 * TABLE_EVERY, 24]
    history.end_block()
    artifact_writes().flush()
    assert [i for what, i, _ in writes if what == "progress"][-1] == 27
