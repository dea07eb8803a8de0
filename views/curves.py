"""The reward/KL curve of a run, drawn from its metrics.jsonl into the run directory.

The Prefect UI has no charts of its own, so the run summary artifact links (and
shows) this one picture: did reward rise, and did the policy drift from the
reference (KL) while it did. Drawn with matplotlib's Agg canvas on a `Figure`
object, never through pyplot, so no global figure state or display is touched from
the flow's threads.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import fsspec

from rundir.run_outputs import read_metrics

CURVE_FILE = "reward_curve.png"


@dataclass(frozen=True)
class CurvePoints:
    """One value per outer iteration; None where the record lacks the metric."""

    iterations: list[int]
    reward_mean: list[float | None]
    kl: list[float | None]
    actor_warmup: list[bool]
    val_reward_mean: list[float | None] | None = None  # held-out evaluation, where it ran
    # With a reward model (S-RM-1): its raw score and the measured rule's verdict, side by
    # side, so reward hacking (the score rising while the rule does not) is visible.
    model_score: list[float | None] | None = None
    fraction_correct: list[float | None] | None = None


def latest_per_iteration(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A resumed run re-runs the iterations after its last committed boundary, so
    metrics.jsonl can hold an iteration twice; the later line is the one the run
    continued from."""
    by_iteration: dict[int, dict[str, Any]] = {}
    for record in records:
        by_iteration[int(record["iteration"])] = record
    return [by_iteration[i] for i in sorted(by_iteration)]


def curve_points(records: list[dict[str, Any]]) -> CurvePoints:
    rows = latest_per_iteration(records)
    return CurvePoints(
        iterations=[int(r["iteration"]) for r in rows],
        reward_mean=[r.get("train/reward_mean") for r in rows],
        kl=[r.get("train/kl") for r in rows],
        actor_warmup=[bool(r.get("train/actor_warmup", 0.0)) for r in rows],
        val_reward_mean=[r.get("val/reward_mean") for r in rows],
        model_score=[r.get("reward/model_raw_mean") for r in rows],
        fraction_correct=[r.get("reward/fraction_correct") for r in rows],
    )


def draw_reward_curve(points: CurvePoints, title: str) -> bytes:
    """PNG bytes: reward mean (top) and KL to the reference (bottom) per iteration;
    critic-warmup iterations are shaded, since the policy does not move there."""
    # Imported here: the flow process needs matplotlib only when it draws, and
    # importing it is a noticeable part of every run's start (docs/performance-log.md
    # section 4, session 7).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with_model = any(v is not None for v in points.model_score or [])
    figure = Figure(figsize=(8, 7.5 if with_model else 5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    if with_model:
        reward_axes, model_axes, kl_axes = figure.subplots(3, 1, sharex=True)
        _draw_model_against_rule(model_axes, points)
    else:
        reward_axes, kl_axes = figure.subplots(2, 1, sharex=True)
    for axes, values, label, color in (
        (reward_axes, points.reward_mean, "reward mean", "tab:green"),
        (kl_axes, points.kl, "KL (policy vs reference)", "tab:blue"),
    ):
        shown = [(i, v) for i, v in zip(points.iterations, values) if v is not None]
        if shown:
            axes.plot(*zip(*shown), marker="o" if len(shown) <= 40 else None, markersize=3, color=color)
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
        for iteration, warmup in zip(points.iterations, points.actor_warmup):
            if warmup:
                axes.axvspan(iteration - 0.5, iteration + 0.5, color="tab:orange", alpha=0.15, linewidth=0)
    evaluated = [(i, v) for i, v in zip(points.iterations, points.val_reward_mean or []) if v is not None]
    if evaluated:
        label = "evaluation reward (rl.validation)"
        reward_axes.plot(*zip(*evaluated), marker="s", markersize=4, color="tab:purple", label=label)
        reward_axes.plot([], [], color="tab:green", label="training reward (sampled)")
        reward_axes.legend(loc="lower right", fontsize=8)
    kl_axes.set_xlabel("outer iteration")
    kl_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if any(points.actor_warmup):
        reward_axes.text(0.01, 0.97, "shaded: critic warmup", transform=reward_axes.transAxes, va="top", fontsize=8)
    figure.suptitle(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _draw_model_against_rule(axes: Any, points: CurvePoints) -> None:
    """The reward model's raw score (left axis) against the measured rule's share of
    correct completions (right axis), per iteration."""
    shown = [(i, v) for i, v in zip(points.iterations, points.model_score or []) if v is not None]
    axes.plot(*zip(*shown), color="tab:red", marker="o" if len(shown) <= 40 else None, markersize=3)
    axes.set_ylabel("reward model score (raw)", color="tab:red")
    axes.grid(True, alpha=0.3)
    correct = [(i, v) for i, v in zip(points.iterations, points.fraction_correct or []) if v is not None]
    if correct:
        rule_axes = axes.twinx()
        rule_axes.plot(*zip(*correct), color="tab:gray", marker="^" if len(correct) <= 40 else None, markersize=3)
        rule_axes.set_ylabel("rule: fraction correct", color="tab:gray")
        rule_axes.set_ylim(-0.05, 1.05)


def write_reward_curve(metrics_path: str, out_path: str, title: str = "PPO run") -> str | None:
    """Draw the curve for every iteration in `metrics_path` into `out_path` (any fsspec
    URL). Returns `out_path`, or None when the run has no iterations yet."""
    records = read_metrics(metrics_path)
    if not records:
        return None
    png = draw_reward_curve(curve_points(records), title)
    with fsspec.open(out_path, "wb") as handle:
        handle.write(png)
    return out_path
