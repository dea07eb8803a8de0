"""A few samples of each iteration as a table artifact in the Prefect UI (S-OPS-3).

Nobody trusts a reward curve without reading completions. A few short rows per
iteration keep the cost flat; the whole batch is in the experience file the table
names. Best effort and sent from the background, as the run's other history.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.artifacts import TableArtifact
from prefect.context import TaskRunContext

from compat.prefect_compat import create_artifact
from contracts.experience import ExperienceReceipt, transcript_text
from views.artifact_writes import artifact_writes
from views.run_artifacts import run_flow_run_id

SHOWN = ("row_id", "prompt", "completion", "reference", "reward", "advantage", "return", "policy_version")
MAX_TEXT = 200  # characters of a prompt or completion in a cell (a picture's data URL is long)
MAX_TRANSCRIPT = 600  # an episode's turns, so the tool call and its answer are visible


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + "…"
    return value


def samples_table(receipt: ExperienceReceipt) -> list[dict[str, Any]]:
    table = []
    for row in receipt.table:
        cells = {column: _cell(row.get(column)) for column in SHOWN}
        if "group" in row:  # several samples per prompt: the prompt they share
            cells = {"group": row["group"], **cells}
        if "messages" in row:
            text = transcript_text(row["messages"])
            cells.update(turns=row["turns"], tool_calls=row["tool_calls"],
                         transcript=text if len(text) <= MAX_TRANSCRIPT else text[:MAX_TRANSCRIPT] + "…")
        table.append(cells)
    return table


def publish_samples(receipt: ExperienceReceipt, key: str | None) -> None:
    """Only inside a task run: the in-process runner has no UI to show it in."""
    if key is None or not receipt.table or TaskRunContext.get() is None:
        return
    description = (
        f"iteration {receipt.iteration}: {len(receipt.table)} of {receipt.samples} samples; "
        f"all of them in {receipt.path}"
    )
    # On the `ppo` flow run (and on this task run), not on the block subflow it runs in.
    artifact = TableArtifact(
        table=samples_table(receipt), key=key, description=description, flow_run_id=run_flow_run_id()
    )

    def write() -> None:
        try:
            create_artifact(artifact)
        except Exception as error:  # the table is a view; the experience file is the record
            get_run_logger().warning(f"samples table: could not publish: {type(error).__name__}: {error}")

    artifact_writes().submit(write)
