"""A run's history as Prefect artifacts: what a user reads in the UI instead of a terminal.

Keys carry the run name (artifact keys are global) and every artifact attaches to the
`ppo` flow run, not to the block that wrote it. Updated in place, and no per-iteration
write carries a table that grows with the run: Prefect records each update as an event
holding the whole table, so a 100-row table re-sent every iteration was most of a long
run's database (S-FOOT-1). Best effort: metrics.jsonl and the boundaries are the
record, so a failed write is a warning. docs/prefect-ui.md "Read a run" lists them.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence
from uuid import UUID

import fsspec
from prefect import get_run_logger
from prefect.artifacts import Artifact, MarkdownArtifact, ProgressArtifact, TableArtifact, update_progress_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.exceptions import MissingContextError
from prefect.logging import get_logger

from compat.prefect_compat import create_artifact
from views.curves import CURVE_FILE, latest_per_iteration, write_reward_curve
from rundir.run_outputs import RunPaths, read_metrics
from views.artifact_writes import artifact_writes
from views.run_artifacts import current_flow_run_id, run_flow_run_id
from contracts.artifact_keys import artifact_key
from contracts.rollout_faults import LOST_KEY, REPLACE_SECONDS_KEY
from contracts.stage_names import TIMED_STAGES

# Table column -> metrics.jsonl key. Short column names keep the UI table narrow; the
# full metric names are documented with metrics.jsonl.
METRIC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "train/reward_mean"),
    ("kl", "train/kl"),
    ("policy_loss", "train/policy_loss"),
    ("value_loss", "train/value_loss"),
)
# Held-out evaluation: columns only in rows of iterations that evaluated
# (table_rows gives the other rows empty cells).
VALIDATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("val_reward_mean", "val/reward_mean"),
    ("val_exact_match", "val/exact_match"),
)
# Stage-time columns appear in the order an iteration runs them; unknown stages follow.
STAGE_ORDER = (*TIMED_STAGES, "iteration")
INLINE_CURVE_MAX_BYTES = 300_000
# Rows of the run's iteration table: the newest iterations, so each update sends the
# same amount however long the run (S-OPS-1); block tables hold the rest.
TABLE_WINDOW = 100
# The run's table is re-sent every TABLE_EVERY iterations, at every commit cadence, at a
# block's end and at the run's end; the progress (one number) with each of those and at
# most every PROGRESS_EVERY_S between them; a block's table once, when the block ends
# (S-FOOT-1).
TABLE_EVERY = 10
# A progress update costs the API about as much CPU as a task run (docs/performance.md,
# "A long run's footprint"); a person reading the UI sees no difference under seconds.
PROGRESS_EVERY_S = 2.0
_TIME_KEY = re.compile(r"^time/(?P<stage>.+)_seconds$")


def _rounded(value: Any) -> Any:
    """Four significant digits read well in a table; NaN becomes an empty cell (JSON
    has no NaN, and the API would reject it)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else float(f"{value:.4g}")
    return value


def _stage_rank(stage: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(stage), "") if stage in STAGE_ORDER else (len(STAGE_ORDER), stage)


def iteration_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """One table row from one metrics.jsonl record. Missing metrics (no policy loss
    during critic warmup) are empty cells, not zeros."""
    row: dict[str, Any] = {"iteration": int(record["iteration"])}
    for column, key in METRIC_COLUMNS:
        row[column] = _rounded(record.get(key))
    version = record.get("train/policy_version")
    row["policy_version"] = None if version is None else int(version)
    warmup = record.get("train/actor_warmup")
    row["actor_warmup"] = None if warmup is None else bool(warmup)
    for column, key in VALIDATION_COLUMNS:
        if key in record:
            row[column] = _rounded(record[key])
    stages = [(m.group("stage"), key) for key in record if (m := _TIME_KEY.match(key))]
    for stage, key in sorted(stages, key=lambda item: _stage_rank(item[0])):
        row[f"{stage}_s"] = _rounded(record[key])
    return row


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row gets every column (in first-seen order), so the UI table lines up
    even when one iteration ran a stage another skipped (weight_sync in warmup)."""
    columns: list[str] = []
    for row in rows:
        columns.extend(c for c in row if c not in columns)
    return [{column: row.get(column) for column in columns} for row in rows]


def _logger():
    try:
        return get_run_logger()
    except MissingContextError:
        return get_logger("ppo.history")


def _best_effort(what: str, action: Callable[[], Any]) -> Any:
    try:
        return action()
    except Exception as error:  # history must never stop a training run
        _logger().warning(f"run history: could not {what}: {type(error).__name__}: {error}")
        return None


def _read_bytes(path: str) -> bytes:
    with fsspec.open(path, "rb") as handle:
        return handle.read()


def _path_text(path: Any) -> str:
    return "-" if not path else f"`{path}`"


def _file_link(path: str) -> str:
    target = path if "://" in path else f"file://{path}"
    return f"[{path}]({target})"


def faults_survived(rows: list[dict[str, Any]]) -> str:
    """The rollout engines a run lost and replaced without stopping (S-ELASTIC-2), as
    one cell: `2 rollout engines lost and replaced (iteration 3: 1, 1.2 s; ...)`."""
    hits = [row for row in rows if row.get(LOST_KEY)]
    if not hits:
        return ""
    total = int(sum(row[LOST_KEY] for row in hits))
    where = "; ".join(
        f"iteration {row['iteration']}: {int(row[LOST_KEY])}, {row.get(REPLACE_SECONDS_KEY, 0.0):.1f} s replacing"
        for row in hits
    )
    return f"{total} rollout engine{'s' if total > 1 else ''} lost and replaced ({where})"


def summary_markdown(
    summary: Mapping[str, Any],
    records: list[dict[str, Any]],
    curve_path: str | None,
    curve_png: bytes | None,
    max_steps: int | None = None,
) -> str:
    """The end-of-run note, from the flow's summary dict and the run's metrics."""
    rows = latest_per_iteration(records)
    run_name = summary.get("run_name", "?")
    target = max_steps if max_steps is not None else summary.get("iterations")
    done = rows[-1]["iteration"] if rows else 0
    final_reward = rows[-1].get("train/reward_mean") if rows else None
    lines = [
        f"# PPO run `{run_name}`",
        "",
        "| | value |",
        "| --- | --- |",
        f"| iterations done | {done} / {target if target is not None else '?'} |",
        f"| policy_version | {summary.get('policy_version', '-')} |",
        f"| last committed boundary | {_path_text(summary.get('last_boundary'))} |",
    ]
    if summary.get("resumed_from"):
        lines.append(f"| resumed from | {_path_text(summary['resumed_from'])} |")
    if final_reward is not None:
        lines.append(f"| final reward mean (iteration {done}) | {final_reward:.4f} |")
    first, last = summary.get("first_reward_mean"), summary.get("last_reward_mean")
    if first is not None and last is not None:
        window = summary.get("reward_window", "")
        lines.append(
            f"| reward, first-{window} → last-{window} mean | {first:.4f} → {last:.4f} ({last - first:+.4f}) |"
        )
    evaluated = [row for row in rows if "val/reward_mean" in row]
    if evaluated:
        first_val, last_val = evaluated[0], evaluated[-1]
        lines.append(
            f"| held-out reward, iteration {first_val['iteration']} → {last_val['iteration']} | "
            f"{first_val['val/reward_mean']:.4f} → {last_val['val/reward_mean']:.4f} |"
        )
        # Each on one scale at both ends: with a normalising reward model
        # the held-out reward is raw before the first update's moments exist, normalised after.
        for metric, label in (("val/exact_match", "exact match"), ("val/fraction_correct", "fraction correct"),
                              ("val/model_raw_mean", "raw reward-model score")):
            if metric in first_val and metric in last_val:
                lines.append(
                    f"| held-out {label}, iteration {first_val['iteration']} → {last_val['iteration']} | "
                    f"{first_val[metric]:.4f} → {last_val[metric]:.4f} |"
                )
    if rows and rows[-1].get("train/kl") is not None:
        lines.append(f"| final KL | {rows[-1]['train/kl']:+.5f} |")
    survived = faults_survived(rows)
    if survived:
        lines.append(f"| faults survived | {survived} |")
    final_model = summary.get("final_model")
    if isinstance(final_model, Mapping):
        for role, path in final_model.items():
            lines.append(f"| exported {role} model | {_path_text(path)} |")
    else:
        lines.append(f"| exported model | {_path_text(final_model)} |")
    lines.append(f"| run directory | {_path_text(summary.get('run_dir'))} |")
    if curve_path:
        lines.append(f"| reward/KL curve | {_file_link(curve_path)} |")
    if curve_png is not None and len(curve_png) <= INLINE_CURVE_MAX_BYTES:
        encoded = base64.b64encode(curve_png).decode("ascii")
        lines += ["", f"![reward and KL per iteration](data:image/png;base64,{encoded})"]
    return "\n".join(lines) + "\n"


def failure_markdown(run_name: str, last_iteration: int | None, error: BaseException) -> str:
    finished = "no iteration finished" if last_iteration is None else f"last finished iteration: {last_iteration}"
    return (
        f"# PPO run `{run_name}` failed\n\n"
        f"{finished}. Error: `{type(error).__name__}: {error}`\n\n"
        "The failed task run in this flow run's graph names the stage and iteration "
        "(for example `rollout[iter=12]`); its logs hold the traceback. Retrying this "
        "flow run, or starting the deployment again with the same `run_name`, resumes "
        "from the last committed boundary.\n"
    )


@dataclass
class RunHistory:
    """The artifacts of one flow run of one training run. Create with `start`, call
    `add_iteration` after each iteration's record is appended to metrics.jsonl, and
    `finish` (or `fail`) once at the end.

    Every write costs the same at iteration 5,000 as at iteration 5 (S-OPS-1): the
    run's table holds the newest `TABLE_WINDOW` rows, a block's table only that
    block's rows, and each is updated in place. Per iteration at most the progress goes
    out, and not more often than every `PROGRESS_EVERY_S`; the run's table (and the
    progress with it) every `TABLE_EVERY` iterations and at every `commit_every` (the
    save cadence), a block's table when `end_block` is called (S-FOOT-1)."""

    run_name: str
    max_steps: int
    commit_every: int = 0  # rl.save_every: the table is re-sent at each commit too
    rows: list[dict[str, Any]] = field(default_factory=list)  # the run table's window, oldest first
    table_id: UUID | None = None
    progress_id: UUID | None = None
    flow_run_id: UUID | None = None  # the `ppo` flow run: every artifact of the run attaches to it
    block: BlockTable | None = None
    table_unsent: bool = False  # rows added since the run's table last went out
    progress_sent_at: float | None = None  # time.monotonic() of the last progress write
    progress_unsent: bool = False  # iterations added since the progress last went out

    @property
    def table_key(self) -> str:
        return artifact_key(self.run_name, "iterations")

    @property
    def progress_key(self) -> str:
        return artifact_key(self.run_name, "progress")

    @property
    def summary_key(self) -> str:
        return artifact_key(self.run_name, "summary")

    @classmethod
    def start(
        cls, run_name: str, max_steps: int, earlier_records: Sequence[dict[str, Any]] = (), start_iteration: int = 1,
        commit_every: int = 0,
    ) -> "RunHistory":
        """Open the history of a (possibly resumed) run. Records at or after
        `start_iteration` are dropped: they belong to work after the last committed
        boundary, which this flow run redoes."""
        kept = [r for r in latest_per_iteration(list(earlier_records)) if int(r["iteration"]) < start_iteration]
        history = cls(
            run_name=run_name,
            max_steps=max_steps,
            commit_every=commit_every,
            rows=[iteration_row(r) for r in kept[-TABLE_WINDOW:]],
            flow_run_id=run_flow_run_id(),
        )
        if history.rows:
            history._publish_table()
        history._publish_progress()
        return history

    def add_iteration(self, record: Mapping[str, Any]) -> None:
        row = iteration_row(record)
        self.rows = ([r for r in self.rows if r["iteration"] != row["iteration"]] + [row])[-TABLE_WINDOW:]
        self.table_unsent = True
        self._keep_block_row(row)
        due = self.table_due(row["iteration"])
        if due:
            self._publish_table()
        if due or self.progress_sent_at is None or time.monotonic() - self.progress_sent_at >= PROGRESS_EVERY_S:
            self._publish_progress()
        else:
            self.progress_unsent = True

    def table_due(self, iteration: int) -> bool:
        """Whether the run's table goes out after `iteration`: every `TABLE_EVERY`th,
        every commit of the save cadence, and the last."""
        return (
            iteration % TABLE_EVERY == 0
            or (self.commit_every > 0 and iteration % self.commit_every == 0)
            or iteration >= self.max_steps
        )

    def end_block(self) -> None:
        """The block subflow running now ends (finished, stopped or failed): its table
        goes out once, and the run's table with the block's last rows."""
        self.send_unsent()

    def send_unsent(self) -> None:
        """What a run that ends (or fails) has not sent yet: the last block's table, the
        run's newest rows and its progress (the table is unsent only once a row was added)."""
        self._publish_block()
        if self.table_unsent:
            self._publish_table()
        if self.progress_unsent:
            self._publish_progress()

    def finish(self, summary: Mapping[str, Any]) -> str | None:
        """Draw the curve into the run directory and publish the summary, once every
        iteration's writes are sent. Returns the curve's path (None when the run has
        no iterations)."""
        paths = RunPaths(str(summary["run_dir"]))
        records = read_metrics(paths.metrics)
        curve_path = _best_effort(
            "draw the reward curve",
            lambda: write_reward_curve(paths.metrics, f"{paths.run_dir}/{CURVE_FILE}", f"PPO run {self.run_name}"),
        )
        curve_png = _best_effort("read the reward curve back", lambda: _read_bytes(curve_path)) if curve_path else None
        markdown = summary_markdown(summary, records, curve_path, curve_png, self.max_steps)
        self.send_unsent()
        artifact_writes().flush()
        self._create("publish the run summary", MarkdownArtifact(
            markdown=markdown, key=self.summary_key, description=f"PPO run {self.run_name}: summary"
        ))
        return curve_path

    def fail(self, error: BaseException) -> None:
        last = self.rows[-1]["iteration"] if self.rows else None
        self.send_unsent()
        artifact_writes().flush()
        self._create("publish the failure note", MarkdownArtifact(
            markdown=failure_markdown(self.run_name, last, error),
            key=self.summary_key,
            description=f"PPO run {self.run_name}: failed",
        ))

    def _create(self, what: str, artifact: Artifact, flow_run_id: UUID | None = None) -> UUID | None:
        """Create `artifact` on the `ppo` flow run (or on `flow_run_id`: a block's own
        table); its id, or None when the API refused."""
        artifact.flow_run_id = flow_run_id or self.flow_run_id
        created = _best_effort(what, lambda: create_artifact(artifact))
        return None if created is None else created.id

    def _update(self, what: str, artifact_id: UUID, update: ArtifactUpdate) -> None:
        def _send() -> None:
            with get_client(sync_client=True) as client:
                client.update_artifact(artifact_id, update)

        _best_effort(what, _send)

    def _send_table(
        self, holder: "RunHistory | BlockTable", what: str, table: list[dict[str, Any]], description: str,
        key: str | None = None, flow_run_id: UUID | None = None,
    ) -> None:
        """Create `holder`'s table artifact on its first write, update it in place after."""
        if holder.table_id is None:
            holder.table_id = self._create(
                f"create {what}", TableArtifact(table=table, key=key, description=description), flow_run_id
            )
        else:
            update = ArtifactUpdate(data=json.dumps(table), description=description)
            self._update(f"update {what}", holder.table_id, update)

    def _publish_table(self) -> None:
        """The table as it is now, sent in the background: a newer one not yet sent
        replaces it (each carries the whole window)."""
        self.table_unsent = False
        table = table_rows(self.rows)
        first, last = table[0]["iteration"], table[-1]["iteration"]
        description = (
            f"PPO run {self.run_name}: one row per outer iteration, iterations {first}-{last} "
            f"(the newest {TABLE_WINDOW}; every iteration's row is in its block's table and in metrics.jsonl)"
        )

        def write() -> None:
            self._send_table(self, "the iteration table", table, description, key=self.table_key)

        artifact_writes().submit(write, key=(self.table_key, "table"))

    def _keep_block_row(self, row: dict[str, Any]) -> None:
        """The block subflow this iteration ran in gets a table of its own iterations
        (no key: it is listed on the block's run page, not among the run's keys), sent
        when the block ends; a row of a new block first sends the previous one's."""
        here = current_flow_run_id()
        if here is None or here == self.flow_run_id:  # not inside a block subflow
            return
        if self.block is not None and self.block.flow_run_id != here:
            self._publish_block()
        if self.block is None:
            self.block = BlockTable(flow_run_id=here)
        self.block.rows.append(row)

    def _publish_block(self) -> None:
        """The kept block's table, once; then no block is kept."""
        block, self.block = self.block, None
        if block is None or not block.rows:
            return
        table = table_rows(block.rows)
        description = (
            f"PPO run {self.run_name}: iterations {table[0]['iteration']}-{table[-1]['iteration']} of this block"
        )

        def write() -> None:
            self._send_table(block, "the block's iteration table", table, description, flow_run_id=block.flow_run_id)

        artifact_writes().submit(write, key=(self.table_key, "block", block.flow_run_id))

    def _publish_progress(self) -> None:
        self.progress_sent_at, self.progress_unsent = time.monotonic(), False
        done = self.rows[-1]["iteration"] if self.rows else 0
        percent = 100.0 * min(done, self.max_steps) / max(self.max_steps, 1)
        description = f"PPO run {self.run_name}: iteration {done} of {self.max_steps}"

        def write() -> None:
            if self.progress_id is None:
                self.progress_id = self._create(
                    "create the progress artifact",
                    ProgressArtifact(progress=percent, key=self.progress_key, description=description),
                )
                return
            _best_effort(
                "update the progress artifact",
                lambda: update_progress_artifact(self.progress_id, percent, description=description),
            )

        artifact_writes().submit(write, key=(self.progress_key, "progress"))


@dataclass
class BlockTable:
    """The iteration table of one block subflow run."""

    flow_run_id: UUID
    rows: list[dict[str, Any]] = field(default_factory=list)
    table_id: UUID | None = None
