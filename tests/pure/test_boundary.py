"""The commit marker and the latest pointer (S-CKPT-2..4)."""

import json

import pytest

from checkpoint.boundary import (
    CheckpointError,
    boundary_path,
    committed_loop_state,
    read_latest,
    read_marker,
    update_latest,
    write_marker,
)


def test_marker_round_trips_and_loop_state_is_verbatim(tmp_path):
    root = str(tmp_path / "checkpoints")
    boundary = boundary_path(root, 4)
    (tmp_path / "checkpoints" / "iter_000004").mkdir(parents=True)
    write_marker(
        boundary, iteration=4, role_steps={"policy": 8, "critic": 16}, loop_state={"critic_warmup_iterations": 2}
    )
    update_latest(root, 4)
    assert read_latest(root) == boundary
    assert committed_loop_state(boundary) == {"critic_warmup_iterations": 2}
    marker = json.loads((tmp_path / "checkpoints" / "iter_000004" / "_SUCCESS").read_text())
    assert marker == {"version": 1, "iteration": 4, "role_steps": {"policy": 8, "critic": 16},
                      "loop_state": {"critic_warmup_iterations": 2}}
    assert not [p for p in (tmp_path / "checkpoints").rglob("*.tmp")]


def test_boundary_without_marker_is_invisible(tmp_path):
    (tmp_path / "iter_000002").mkdir()
    assert read_marker(str(tmp_path / "iter_000002")) is None
    assert read_latest(str(tmp_path)) is None


def test_pointer_to_uncommitted_boundary_is_an_error_not_a_fresh_start(tmp_path):
    (tmp_path / "iter_000002").mkdir()
    (tmp_path / "latest_checkpoint.txt").write_text("iter_000002\n")
    with pytest.raises(CheckpointError, match="iter_000002, which has no _SUCCESS"):
        read_latest(str(tmp_path))


def test_corrupt_marker_names_file_and_position(tmp_path):
    (tmp_path / "iter_000001").mkdir()
    (tmp_path / "iter_000001" / "_SUCCESS").write_text('{"iteration": 1,\n  oops}')
    with pytest.raises(CheckpointError, match=r"_SUCCESS is not valid JSON .* line 2, column 3"):
        read_marker(str(tmp_path / "iter_000001"))


def test_loop_state_values_must_be_json_scalars(tmp_path):
    with pytest.raises(CheckpointError, match=r"loop_state\['nested'\] must be a JSON scalar"):
        write_marker(str(tmp_path), iteration=1, role_steps={}, loop_state={"nested": {"a": 1}})


def _boundary_with_files(tmp_path):
    """A boundary folder with two role files and a marker that records them."""
    from checkpoint.boundary_files import boundary_files

    folder = tmp_path / "checkpoints" / "iter_000002"
    (folder / "policy").mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "policy" / "model.safetensors").write_bytes(b"weights" * 100)
    (folder / "data" / "cursor.json").write_text('{"epoch": 0}')
    files = boundary_files(str(folder), skip=("_SUCCESS",))
    write_marker(str(folder), iteration=2, role_steps={"policy": 1, "critic": 1}, loop_state={}, files=files)
    return folder


def test_marker_records_size_and_sha256_of_every_file_but_itself(tmp_path):
    import hashlib

    folder = _boundary_with_files(tmp_path)
    marker = json.loads((folder / "_SUCCESS").read_text())
    # 7 bytes x 100 = 700 bytes; the digest is the file's own sha256
    assert marker["files"] == {
        "data/cursor.json": {"size": 12, "sha256": hashlib.sha256(b'{"epoch": 0}').hexdigest()},
        "policy/model.safetensors": {"size": 700, "sha256": hashlib.sha256(b"weights" * 100).hexdigest()},
    }


def test_verifier_accepts_the_boundary_as_committed(tmp_path):
    from checkpoint.boundary_files import verify_marker_files

    folder = _boundary_with_files(tmp_path)
    (folder / "policy" / "extra.txt").write_text("not vouched for, not read")
    assert verify_marker_files(str(folder), read_marker(str(folder))) is True


@pytest.mark.parametrize("damage, message", [
    (lambda f: f.write_bytes(f.read_bytes()[:350]), r"policy/model.safetensors is 350 bytes, its _SUCCESS records 700"),
    (lambda f: f.write_bytes(b"X" + f.read_bytes()[1:]), r"policy/model.safetensors does not match the sha256"),
    (lambda f: f.unlink(), r"policy/model.safetensors is missing"),
])
def test_verifier_refuses_a_truncated_changed_or_missing_file_naming_it_and_the_boundary(tmp_path, damage, message):
    from checkpoint.boundary_files import BoundaryCorrupt, verify_marker_files

    folder = _boundary_with_files(tmp_path)
    damage(folder / "policy" / "model.safetensors")
    with pytest.raises(BoundaryCorrupt, match=rf"iter_000002: {message}"):
        verify_marker_files(str(folder), read_marker(str(folder)))


def test_marker_without_files_is_readable_and_reported_unverified(tmp_path):
    from checkpoint.boundary_files import verify_marker_files

    (tmp_path / "iter_000001").mkdir()
    (tmp_path / "iter_000001" / "_SUCCESS").write_text('{"version": 1, "iteration": 1, "role_steps": {}}')
    assert verify_marker_files(str(tmp_path / "iter_000001"), read_marker(str(tmp_path / "iter_000001"))) is False


def test_optimizer_removed_by_retention_is_named_as_such_not_as_corruption(tmp_path):
    from checkpoint.boundary_files import BoundaryCorrupt, boundary_files, verify_marker_files

    folder = tmp_path / "iter_000002"
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "optimizer.pt").write_bytes(b"moments")
    files = boundary_files(str(folder), skip=("_SUCCESS",))
    write_marker(str(folder), iteration=2, role_steps={}, loop_state={}, files=files)
    (folder / "policy" / "optimizer.pt").unlink()
    (folder / "policy" / "OPTIMIZER_PRUNED").write_text("removed")
    with pytest.raises(BoundaryCorrupt, match=r"policy/optimizer.pt was removed by retention \(rl.keep_optim_last\)"):
        verify_marker_files(str(folder), read_marker(str(folder)))


def test_retention_removes_a_sharded_optimizer_folder_and_says_so(tmp_path):
    """S-CKPT-6 on a DCP role folder (S-SCALE-2): every rank's optimizer shard goes,
    with the note, and resuming from that boundary is refused as pruned."""
    from checkpoint.boundary_files import BoundaryCorrupt, boundary_files, verify_marker_files
    from checkpoint.retention import prune_optimizer_state

    root = tmp_path / "checkpoints"
    for iteration in (2, 4):
        folder = root / f"iter_{iteration:06d}"
        for part in ("model", "optimizer"):
            (folder / "policy" / part).mkdir(parents=True)
            for name in (".metadata", "__0_0.distcp", "__1_0.distcp"):
                (folder / "policy" / part / name).write_bytes(part.encode() + name.encode())
        files = boundary_files(str(folder), skip=("_SUCCESS",))
        write_marker(str(folder), iteration=iteration, role_steps={}, loop_state={}, files=files)
    assert prune_optimizer_state(str(root), None) == [f"{root}/iter_000002/policy"]
    assert not (root / "iter_000002" / "policy" / "optimizer").exists()
    assert (root / "iter_000002" / "policy" / "model" / "__1_0.distcp").exists()
    assert (root / "iter_000004" / "policy" / "optimizer" / "__1_0.distcp").exists()
    with pytest.raises(BoundaryCorrupt, match=r"policy/optimizer/\.metadata was removed by retention"):
        verify_marker_files(str(root / "iter_000002"), read_marker(str(root / "iter_000002")))


def test_a_commit_clears_a_stale_folder_marker_first_but_never_the_resume_point(tmp_path):
    from checkpoint.boundary import clear_for_commit

    root = str(tmp_path)
    for iteration in (2, 4):
        (tmp_path / f"iter_00000{iteration}" / "policy").mkdir(parents=True)
        (tmp_path / f"iter_00000{iteration}" / "policy" / "OPTIMIZER_PRUNED").write_text("a stale note")
        write_marker(boundary_path(root, iteration), iteration=iteration, role_steps={}, loop_state={})
    update_latest(root, 2)  # went back to iter_000002: iter_000004 is the abandoned branch
    assert clear_for_commit(root, 4) is True and not (tmp_path / "iter_000004").exists()
    assert clear_for_commit(root, 6) is False
    with pytest.raises(CheckpointError, match="refusing to commit over .*iter_000002: latest_checkpoint.txt names it"):
        clear_for_commit(root, 2)
    assert read_marker(boundary_path(root, 2)) is not None


@pytest.mark.parametrize("damaged, way_back", [
    ((4,), "boundary that verifies is iter_000003: resume from it with `--resume-from iter_000003`"),
    ((4, 3), "boundary that verifies is iter_000002: resume from it with `--resume-from iter_000002`"),
    ((4, 3, 2), "No earlier boundary of this run verifies"),
])
def test_a_damaged_boundary_is_refused_naming_the_newest_earlier_one_that_verifies(tmp_path, damaged, way_back):
    """S-CKPT-9: the way back after damage (a disk error, a boundary written before its
    files were synced) is named, never taken silently."""
    import re

    from checkpoint.boundary_files import BoundaryCorrupt, boundary_files
    from rundir.resume import ResumePoint, verify_resume_point

    root = tmp_path / "checkpoints"
    for iteration in (2, 3, 4):
        folder = root / f"iter_{iteration:06d}"
        (folder / "policy").mkdir(parents=True)
        (folder / "policy" / "model.safetensors").write_bytes(b"weights" * 100)
        write_marker(str(folder), iteration=iteration, role_steps={}, loop_state={},
                     files=boundary_files(str(folder), skip=("_SUCCESS",)))
    for iteration in damaged:
        (root / f"iter_{iteration:06d}" / "policy" / "model.safetensors").write_bytes(b"")  # lost in a power cut
    latest = str(root / "iter_000004")
    refusal = rf"iter_000004: policy/model.safetensors is 0 bytes, its _SUCCESS records 700 .*{re.escape(way_back)}"
    with pytest.raises(BoundaryCorrupt, match=refusal):
        verify_resume_point(ResumePoint(latest, 4, read_marker(latest)))
