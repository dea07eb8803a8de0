"""Where held-out evaluation (S-OPS-2) shows up besides metrics.jsonl: the iteration
table's columns, the run summary, the reward curve, the progress line and the reward
rise, all of which must also take the before-training evaluation's row 0, which has
no training metrics."""

from __future__ import annotations

from configs.loading import load_config
from views.curves import curve_points, draw_reward_curve
from views.history import iteration_row, summary_markdown, table_rows
from flows.run_report import held_out_rise, model_build_line, progress_line, reward_rise
from tests.conftest import TINY_PROFILE

BEFORE = {"iteration": 0, "val/reward_mean": 0.1, "val/exact_match": 0.1, "time/evaluate_seconds": 0.02}


def _trained(iteration: int, reward: float, evaluated: float | None = None) -> dict:
    record = {
        "iteration": iteration, "train/reward_mean": reward, "train/kl": 0.01, "train/value_loss": 0.2,
        "train/policy_loss": -0.03, "train/actor_warmup": 0.0, "train/policy_version": float(iteration),
        "time/iteration_seconds": 0.5,
    }
    if evaluated is not None:
        record |= {"val/reward_mean": evaluated, "val/exact_match": evaluated, "time/evaluate_seconds": 0.02}
    return record


def test_the_iteration_table_shows_evaluation_columns_only_where_it_ran():
    rows = table_rows([iteration_row(BEFORE), iteration_row(_trained(1, 0.2)), iteration_row(_trained(2, 0.3, 0.4))])
    assert [row["val_reward_mean"] for row in rows] == [0.1, None, 0.4]
    assert rows[0]["reward_mean"] is None and rows[0]["policy_version"] is None  # row 0: no training yet
    assert "val_reward_mean" not in iteration_row(_trained(1, 0.2))  # runs without evaluation keep their columns


def test_summary_curve_progress_and_rise_read_the_evaluation_rows():
    records = [BEFORE, _trained(1, 0.2), _trained(2, 0.3, 0.4)]
    markdown = summary_markdown({"run_name": "r", "iterations": 2}, records, None, None)
    assert "| held-out reward, iteration 0 → 2 | 0.1000 → 0.4000 |" in markdown
    assert "| held-out exact match, iteration 0 → 2 | 0.1000 → 0.4000 |" in markdown
    points = curve_points(records)
    assert points.val_reward_mean == [0.1, None, 0.4] and points.reward_mean == [None, 0.2, 0.3]
    assert draw_reward_curve(points, "r").startswith(b"\x89PNG")
    config = load_config(TINY_PROFILE)
    assert progress_line(config, BEFORE) == "iter    0/40  before training: val reward 0.100 exact 0.100"
    assert progress_line(config, records[2]).endswith("val reward 0.400 exact 0.400")
    assert reward_rise(records)["first_reward_mean"] == 0.2  # row 0 has no training reward
    assert held_out_rise(records) == {"first_val_reward": 0.1, "first_val_iteration": 0,
                                      "last_val_reward": 0.4, "last_val_iteration": 2,
                                      "val_metric": "val/reward_mean", "val_metric_meaning": "reward"}
    assert held_out_rise(records[1:]) == {}  # one evaluation: no rise to tell


def test_a_run_that_must_build_its_tiny_model_says_so_and_a_built_one_does_not(tmp_path):
    config = load_config("configs/ppo_tiny_tools_cpu.py", [f"model.path={tmp_path / 'tools'}"])
    line = model_build_line(config)
    assert line is not None and str(tmp_path / "tools") in line and "tool_lookup for 1000 steps" in line
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "config.json").write_text("{}")
    assert model_build_line(config) is None


def test_the_held_out_rise_compares_one_scale_the_rules_figure_first_else_raw_against_raw():
    # An RLHF run with normalised scores: val/reward_mean is raw at iteration 0 (no running
    # moments yet) and normalised after, so 0.285 -> 0.966 compares two scales (issue 59).
    before = {"iteration": 0, "val/reward_mean": 0.285, "val/model_raw_mean": 0.285, "val/fraction_correct": 0.05}
    after = {"iteration": 10, "val/reward_mean": 0.966, "val/model_raw_mean": 1.5, "val/fraction_correct": 0.10}
    rise = held_out_rise([before, after])
    figures = (rise["val_metric"], rise["first_val_reward"], rise["last_val_reward"])
    assert figures == ("val/fraction_correct", 0.05, 0.10)
    no_rule = [{k: v for k, v in row.items() if k != "val/fraction_correct"} for row in (before, after)]
    rise = held_out_rise(no_rule)
    assert (rise["val_metric"], rise["first_val_reward"], rise["last_val_reward"]) == ("val/model_raw_mean", 0.285, 1.5)
    assert rise["val_metric_meaning"] == "raw reward-model score"


def test_the_summary_markdown_shows_the_held_out_figures_on_one_scale_each():
    rows = [{"iteration": 0, "val/reward_mean": 0.285, "val/model_raw_mean": 0.285, "val/fraction_correct": 0.05},
            {"iteration": 10, "val/reward_mean": 0.966, "val/model_raw_mean": 1.5, "val/fraction_correct": 0.10}]
    markdown = summary_markdown({"run_name": "r", "iterations": 10}, rows, None, None)
    assert "| held-out fraction correct, iteration 0 → 10 | 0.0500 → 0.1000 |" in markdown
    assert "| held-out raw reward-model score, iteration 0 → 10 | 0.2850 → 1.5000 |" in markdown


def test_the_summary_line_names_the_held_out_figure(capsys):
    from cli.command import print_summary

    rise = held_out_rise([{"iteration": 0, "val/model_raw_mean": 0.25}, {"iteration": 4, "val/model_raw_mean": 1.0}])
    print_summary({"run_name": "r", "policy_version": 4, "run_dir": "/runs/r", "last_boundary": None, **rise})
    assert ("  held-out val/model_raw_mean (raw reward-model score): 0.250 at iteration 0 -> 1.000 at iteration 4 "
            "(rise +0.750)") in capsys.readouterr().out.splitlines()
