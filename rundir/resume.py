"""Resume = run the flow again: find the last committed boundary, check it belongs
to this configuration, and put the run's files back as they were at it (S-CKPT-2/3,
S-CW-9/10). Restoring the roles from it drives actors, so it lives with the iteration
program (flows/iteration_loop.py `restore_roles`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any



from checkpoint.boundary import (
    MARKER_NAME,
    atomic_write_text,
    boundary_name,
    read_latest,
    read_marker,
    read_metrics_row,
    update_latest,
)
from checkpoint.boundary_files import BoundaryCorrupt, verify_marker_files
from checkpoint.retention import committed_boundaries
from configs.schema import PPOConfig
from rundir.resume_log import resume_logger
from rundir.run_identity import RunIdentity, identity_problem
from rundir.run_outputs import RunPaths, append_metrics, read_metrics
from contracts.experience import remove_experience_after, set_aside_experience


class ResumeError(RuntimeError):
    pass


@dataclass(frozen=True)
class ResumePoint:
    boundary: str
    iteration: int
    marker: dict[str, Any]
    went_back: bool = False  # chosen with resume_from: later rows are set aside, the pointer moves back


def find_resume_point(
    config: PPOConfig, paths: RunPaths, *, resume: bool, resume_from: str | None = None,
    identity: RunIdentity | None = None,
) -> ResumePoint | None:
    """Decide where this flow run starts: the latest committed boundary, or the one
    named by `resume_from` (S-FAULT-3). Reads only; writes nothing, so a refusal
    (a corrupt file included) leaves the run directory exactly as it was."""
    return verify_resume_point(
        resume_boundary(config, paths, resume=resume, resume_from=resume_from, identity=identity)
    )


def verify_resume_point(point: ResumePoint | None) -> ResumePoint | None:
    """The boundary's files read back against the digests its marker records
    (S-FAULT-3): a damaged file is refused naming it, and the way back (S-CKPT-9).
    Returns `point`."""
    if point is None:
        return None
    try:
        verified = verify_marker_files(point.boundary, point.marker)
    except BoundaryCorrupt as error:
        # Never a silent fall back to an older boundary: the user (or a deployment's
        # auto-resume, which fails here) decides to go back.
        raise BoundaryCorrupt(f"{error}. {way_back(point)}") from None
    if not verified:
        resume_logger().warning(
            f"{point.boundary}/{MARKER_NAME} records no file digests (an older marker); its files could not be verified"
        )
    return point


def way_back(point: ResumePoint) -> str:
    """The newest committed boundary before `point` whose files all verify, as the
    option that resumes from it; or why there is none."""
    checkpoints = point.boundary.rsplit("/", 1)[0]
    for earlier in reversed(committed_boundaries(checkpoints)):
        name = earlier.rsplit("/", 1)[-1]
        marker = read_marker(earlier)
        if marker is None or int(marker["iteration"]) >= point.iteration:
            continue
        try:
            if not verify_marker_files(earlier, marker):
                continue  # an older marker without digests cannot be vouched for
        except BoundaryCorrupt:
            continue  # damaged too, or its optimizer state removed by retention
        return (
            f"The newest earlier boundary that verifies is {name}: resume from it with `--resume-from {name}` "
            f"(flow parameter resume_from=\"{name}\"); the rows and experience after it are set aside"
        )
    return (
        "No earlier boundary of this run verifies (retention keeps optimizer state only for the newest "
        "rl.keep_optim_last boundaries), so it cannot be resumed: start it again under a new job.name"
    )


def resume_boundary(
    config: PPOConfig, paths: RunPaths, *, resume: bool, resume_from: str | None = None,
    identity: RunIdentity | None = None,
) -> ResumePoint | None:
    """`find_resume_point` without reading the boundary's files back: cheap enough for
    the command line to refuse a run that cannot resume before it starts anything.
    `identity`: the run's, read at launch (rundir/run_identity.py)."""
    if resume_from is not None:
        if not resume:
            raise ResumeError(
                f"resume_from={resume_from!r} resumes a run; it cannot be combined with a fresh start (--fresh)"
            )
        boundary = chosen_boundary(paths, resume_from)
    else:
        latest = read_latest(paths.checkpoints)
        if not resume:
            if latest is not None:
                raise ResumeError(
                    f"run {config.job.name!r} already has a committed boundary ({latest}); refusing to start fresh "
                    "over it. Resume it (resume=True, the default), pick another job.name, or move the folder away."
                )
            return None
        if latest is None:
            return None
        boundary = latest
    marker = read_marker(boundary)
    assert marker is not None  # read_latest and chosen_boundary refuse uncommitted boundaries
    if int(marker["iteration"]) > config.rl.max_steps:  # S-STOP-4: a rerun never reads "25 / 12" as done
        raise ResumeError(
            f"rl.max_steps={config.rl.max_steps} is below iteration {int(marker['iteration'])}, which {boundary} "
            f"already committed; resume refused. Resume with rl.max_steps={int(marker['iteration'])} or more "
            "(more continues the run), go back with resume_from, or start a new job.name."
        )
    # Before any role loads a model: the config's keys, then the model folders (S-CKPT-4, S-SEC-4, S-RM-2).
    changed = identity_problem(marker, identity or RunIdentity.at_launch(config), boundary)
    if changed:
        raise ResumeError(changed)
    return ResumePoint(boundary=boundary, iteration=int(marker["iteration"]), marker=marker,
                       went_back=resume_from is not None)


def chosen_boundary(paths: RunPaths, name: str) -> str:
    """The committed boundary `name` (`iter_000010`) of this run, or a refusal that
    lists the ones there are."""
    committed = [path.rsplit("/", 1)[-1] for path in committed_boundaries(paths.checkpoints)]
    if name not in committed:
        listed = ", ".join(committed) if committed else "none"
        raise ResumeError(
            f"resume_from={name!r}: {paths.checkpoints} has no committed boundary of that name (a boundary without "
            f"{MARKER_NAME} was never committed); committed boundaries: {listed}"
        )
    return f"{paths.checkpoints}/{name}"


def start_from_scratch(paths: RunPaths) -> None:
    """No committed boundary: every iteration runs again from 1, so rows a killed
    earlier attempt wrote before its first commit are dropped, or they would appear
    twice (S-FAULT-2); that includes the before-training evaluation's row 0. Their
    experience files go too (S-OPS-3)."""
    truncate_metrics(paths.metrics, -1)
    remove_experience_after(paths.experience, 0)


def truncate_metrics(path: str, last_iteration: int) -> None:
    """Drop metric lines of iterations after the boundary: they are replayed, and
    the file must read like the uninterrupted run's."""
    records = read_metrics(path)
    kept = [r for r in records if int(r.get("iteration", 0)) <= last_iteration]
    if len(kept) != len(records):
        atomic_write_text(path, _rows(kept))


def restore_boundary_row(path: str, boundary: str, iteration: int) -> None:
    """A run killed after its commit moved the pointer but before the iteration's
    metrics row was appended: the row is taken from the boundary, so every iteration
    appears exactly once (S-FAULT-2)."""
    records = read_metrics(path)
    if any(int(r.get("iteration", 0)) == iteration for r in records):
        return
    row = read_metrics_row(boundary)
    if row is not None:
        append_metrics(path, row)
        resume_logger().info(f"metrics row of iteration {iteration} restored from {boundary}")


def go_back(paths: RunPaths, iteration: int) -> None:
    """After every role restored from an earlier boundary: its later metric rows go
    to a file beside metrics.jsonl (kept, not deleted), then the pointer moves back to
    it, so a crash of the resumed run resumes this branch, not the abandoned one. The
    abandoned boundaries stay on disk until this run commits their iterations anew
    (checkpoint.boundary.clear_for_commit)."""
    aside = set_aside_metrics(paths.metrics, iteration)
    if aside is not None:
        resume_logger().info(f"metrics rows after iteration {iteration} set aside in {aside}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    experience = set_aside_experience(paths.experience, iteration, stamp)  # S-FAULT-3, S-OPS-3
    if experience is not None:
        resume_logger().info(f"experience files after iteration {iteration} set aside in {experience}")
    update_latest(paths.checkpoints, iteration)


def set_aside_metrics(path: str, last_iteration: int) -> str | None:
    """Move the rows after `last_iteration` into `metrics.after_iter_NNNNNN.<UTC time>.jsonl`
    beside `path`, written before metrics.jsonl is rewritten so no row is ever only in
    memory. Returns the new file, or None when there was nothing after it."""
    records = read_metrics(path)
    later = [r for r in records if int(r.get("iteration", 0)) > last_iteration]
    if not later:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = f"{path.rsplit('/', 1)[0]}/metrics.after_{boundary_name(last_iteration)}.{stamp}.jsonl"
    atomic_write_text(aside, _rows(later))
    atomic_write_text(path, _rows([r for r in records if int(r.get("iteration", 0)) <= last_iteration]))
    return aside


def _rows(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
