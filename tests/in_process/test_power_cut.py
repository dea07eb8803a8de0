"""A power cut at any moment of a commit (S-CKPT-9, S-FAULT-2/3): the run's output
root lives on tests/support/volatile_fs.py, which keeps a write only once it is fsynced.
After each cut the pointer names a boundary that verifies, never one older than the last
finished commit; no boundary with a marker has a missing or short file; and (slow) a
rerun ends bitwise as the uninterrupted run."""

from __future__ import annotations

import multiprocessing
import random
from pathlib import Path

import pytest

from checkpoint.boundary import MARKER_NAME, read_latest_name, read_marker
from checkpoint.role_layout import OPTIMIZER_PRUNED_NOTE
from rundir.resume import find_resume_point
from rundir.run_outputs import RunPaths
from tests.support.helpers import boundary, metric_records, weights_digest, without_timings
from tests.support.power_cut import (
    RUN_NAME,
    VolatileMount,
    commit_moments,
    commit_operations,
    committed_by,
    export_operations,
    fuse_missing,
    power_cut_config,
    read_operations,
    run_steps,
)


@pytest.fixture
def volatile_root(tmp_path):
    missing = fuse_missing()
    if missing is not None:
        pytest.skip(f"no FUSE test filesystem: {missing}")
    return tmp_path


def assert_survivors_sound(
    root: Path, model_dir: str, committed: int, context: str = "", extra: tuple[str, ...] = ()
) -> None:
    """What a user finds after the cut: every boundary with a marker holds every file
    the marker lists, at its recorded size (retention's removals aside), and the
    pointer names a boundary that resume accepts, no older than `committed`."""
    checkpoints = root / RUN_NAME / "checkpoints"
    for folder in sorted(checkpoints.glob("iter_*")) if checkpoints.exists() else []:
        marker = read_marker(str(folder))
        if marker is None:
            continue
        for relative, recorded in marker["files"].items():
            role = folder / relative.split("/")[0]
            if "optimizer" in relative and (role / OPTIMIZER_PRUNED_NOTE).exists():
                continue
            path = folder / relative
            assert path.exists(), f"{context}{folder.name}/{MARKER_NAME} lists {relative}, which did not survive"
            assert path.stat().st_size == recorded["size"], f"{context}{folder.name}/{relative} survived short"
    pointed = read_latest_name(str(checkpoints)) if checkpoints.exists() else None
    assert int((pointed or "iter_0").removeprefix("iter_")) >= committed, (
        f"{context}iteration {committed} was committed before the cut, but the pointer names {pointed} after it"
    )
    config = power_cut_config(root, model_dir, 8, *extra)
    find_resume_point(config, RunPaths.for_config(config), resume=True)  # verifies every file it lists


@pytest.fixture(scope="module")
def operations(tiny_model_dir, tmp_path_factory):
    """The changing operations of an uninterrupted two-iteration run, numbered as the
    filesystem counts them: where each moment of a commit falls."""
    if fuse_missing() is not None:
        return []
    folder = tmp_path_factory.mktemp("traced")
    with VolatileMount(folder, log=folder / "operations.log") as mount:
        run_steps(str(mount.path), tiny_model_dir, 2)
    return read_operations(folder / "operations.log")


@pytest.mark.parametrize("metadata, moment", [("strict", "saves to marker"), ("journaled", "marker to pointer")])
def test_a_power_cut_in_a_commit_leaves_a_boundary_that_verifies(
    volatile_root, tiny_model_dir, operations, metadata, moment
):
    cut_at = commit_moments(operations, 2)[moment]
    mount = VolatileMount(volatile_root, metadata=metadata).mount(cut_at=cut_at)
    try:
        with pytest.raises(Exception):  # the cut fails every operation from then on
            run_steps(str(mount.path), tiny_model_dir, 2)
        mount.unmount()
        mount.mount()
        assert_survivors_sound(mount.path, tiny_model_dir, committed_by(operations, cut_at))
    finally:
        mount.unmount()


def _in_child(root: Path, model_dir: str, steps: int, extra: tuple[str, ...]) -> int:
    """One run in a fresh process (a new pid, as after a reboot: the run lock of the
    cut run belongs to a dead process), forked from a server that imported the project
    once."""
    context = multiprocessing.get_context("forkserver")
    child = context.Process(target=run_steps, args=(str(root), model_dir, steps, *extra))
    child.start()
    child.join(600)
    return child.exitcode


@pytest.mark.slow
@pytest.mark.parametrize("extra, random_cuts", [((), 20), (("rl.rollout.max_staleness=1",), 6)],
                         ids=["synchronous", "one-step-off"])
def test_power_cuts_at_random_moments_of_commits_then_the_rerun_ends_as_the_uninterrupted_run(
    volatile_root, tiny_model_dir, extra, random_cuts
):
    """Cuts at random operations of the commits of iterations 2..4 and the final export,
    under both metadata models, plus each named moment of commit 3 (the in-flight batch's
    save too, one step off, S-ASYNC-3); after each the survivors are sound and a rerun
    ends with the uninterrupted run's weights and rows."""
    multiprocessing.set_forkserver_preload(["flows.in_process", "tests.support.power_cut"])
    steps = 4
    straight = VolatileMount(volatile_root / "straight", log=volatile_root / "operations.log")
    with straight:
        assert _in_child(straight.path, tiny_model_dir, steps, extra) == 0
        run_dir = straight.path / RUN_NAME
        expected_weights = [weights_digest(boundary(run_dir, steps) / role) for role in ("policy", "critic")]
        expected_rows = [without_timings(row) for row in metric_records(run_dir)]
    operations = read_operations(volatile_root / "operations.log")
    window = [n for it in range(2, steps + 1) for n, _, _ in commit_operations(operations, it)]
    window += [n for n, _, _ in export_operations(operations)]
    cuts = sorted(random.Random(47).sample(window, random_cuts)) + sorted(commit_moments(operations, 3).values())
    for index, cut_at in enumerate(cuts):
        metadata = ("strict", "journaled")[index % 2]
        mount = VolatileMount(volatile_root / f"cut{index}", metadata=metadata)
        mount.mount(cut_at=cut_at)
        try:
            _in_child(mount.path, tiny_model_dir, steps, extra)
            mount.unmount()
            mount.mount()
            context = f"cut at operation {cut_at} ({metadata}, {operations[cut_at - 1][1:]}): "
            assert_survivors_sound(mount.path, tiny_model_dir, committed_by(operations, cut_at), context, extra)
            assert _in_child(mount.path, tiny_model_dir, steps, extra) == 0, context
            run_dir = mount.path / RUN_NAME
            weights = [weights_digest(boundary(run_dir, steps) / role) for role in ("policy", "critic")]
            assert weights == expected_weights, context
            assert [without_timings(row) for row in metric_records(run_dir)] == expected_rows, context
        finally:
            mount.unmount()
