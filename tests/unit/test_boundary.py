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
    write_marker(boundary, iteration=4, role_steps={"policy": 8, "critic": 16}, loop_state={"critic_warmup_iterations": 2})
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
