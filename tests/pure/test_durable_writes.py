"""What a run writes beside its boundaries survives a power cut once written (S-CKPT-9):
the metrics row, the experience file, the export and the run lock, on the filesystem of
tests/support/volatile_fs.py, which forgets every write not fsynced."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from checkpoint.export import write_aside
from contracts.experience import experience_file, write_experience
from rundir.run_lock import LOCK_NAME, RunLock
from rundir.run_outputs import RunPaths, append_metrics, read_metrics
from tests.support.power_cut import VolatileMount, fuse_missing


def _export(aside: str) -> dict[str, str]:
    (Path(aside) / "policy").mkdir(parents=True)
    (Path(aside) / "policy" / "model.safetensors").write_bytes(b"w" * 5000)
    return {"policy": f"{aside}/policy"}


@pytest.mark.parametrize("metadata", ["strict", "journaled"])
def test_rows_samples_export_and_lock_survive_a_power_cut(tmp_path, metadata):
    missing = fuse_missing()
    if missing is not None:
        pytest.skip(f"no FUSE test filesystem: {missing}")
    with VolatileMount(tmp_path, metadata=metadata) as mount:
        paths = RunPaths(str(mount.path / "run"))
        lock = RunLock(paths.run_dir).acquire()
        paths.ensure()
        append_metrics(paths.metrics, {"iteration": 1, "train/loss": 0.5})
        write_experience(paths.experience, 1, [{"iteration": 1, "completion": "42"}])
        write_aside(paths.final_model, _export)
        mount.power_cycle()
        assert read_metrics(paths.metrics) == [{"iteration": 1, "train/loss": 0.5}]
        with gzip.open(experience_file(paths.experience, 1), "rt") as samples:
            assert [json.loads(line) for line in samples] == [{"completion": "42", "iteration": 1}]
        assert (Path(paths.final_model) / "policy" / "model.safetensors").read_bytes() == b"w" * 5000
        held = json.loads((Path(paths.run_dir) / LOCK_NAME).read_text())  # a live holder's lock is not lost
        assert (held["pid"], held["token"]) == (os.getpid(), lock.holder.token)
