"""Experience files (issue 18 item 3, S-OPS-3) through the in-process runner: the
flow's own iteration program and resume code on role objects.

Each iteration's samples land in `<run>/experience/iter_NNNNNN.jsonl.gz`, read back
with `datasets` as one table, agree with the iteration's metrics, follow
`job.experience` retention, and are rewound on resume like the metrics rows."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import metric_records


def _run(tiny_overrides, name: str, *extra: str, resume_from: str | None = None) -> Path:
    config = load_config(TINY_PROFILE, tiny_overrides + [f"job.name={name}", "job.trackers=[]", *extra])
    run_in_process(config, paths=RunPaths.for_config(config), resume=True, resume_from=resume_from)
    return Path(config.job.output_root) / name


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.open(path, "rt")]


def _files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "experience").glob("iter_*.jsonl.gz"))


def test_each_iteration_writes_its_samples_readable_with_datasets_and_keeps_the_last_k(tiny_overrides):
    import datasets

    run_dir = _run(tiny_overrides, "kept", "rl.max_steps=3", "job.experience.last=2")
    assert _files(run_dir) == ["iter_000002.jsonl.gz", "iter_000003.jsonl.gz"]  # iteration 1 retired
    table = datasets.load_dataset(
        "json", data_files=sorted(str(p) for p in (run_dir / "experience").glob("iter_*.jsonl.gz")), split="train",
        cache_dir=str(run_dir / "hf-cache"),
    )
    assert table.num_rows == 2 * 16  # one object per sample, rl.batch_size=16
    required = {"prompt", "completion", "reward", "advantage", "return", "policy_version", "row_id"}
    assert required <= set(table.column_names)
    records = {r["iteration"]: r for r in metric_records(run_dir)}
    for iteration in (2, 3):
        rows = _rows(run_dir / "experience" / f"iter_{iteration:06d}.jsonl.gz")
        assert statistics.fmean(r["reward"] for r in rows) == records[iteration]["train/reward_mean"]
        assert {r["policy_version"] for r in rows} == {records[iteration]["rollout/policy_version"]}
        assert all(r["completion"] is not None and r["prompt"] for r in rows)


def test_experience_off_writes_none(tiny_overrides):
    run_dir = _run(tiny_overrides, "off", "rl.max_steps=1", "job.experience.keep=off")
    assert not (run_dir / "experience").exists()


def test_resume_rewinds_the_experience_after_its_boundary_like_the_metrics_rows(tiny_overrides):
    common = ("rl.save_every=2", "rl.keep_optim_last=0", "job.experience.keep=all")
    straight = _run(tiny_overrides, "straight", "rl.max_steps=4", *common)
    # A run that got past its boundary (iteration 3 written, no boundary 3): a plain
    # rerun drops iteration 3's file with its row and writes both anew.
    run_dir = _run(tiny_overrides, "resumed", "rl.max_steps=3", "rl.save_final=false", *common)
    assert _files(run_dir)[-1] == "iter_000003.jsonl.gz"
    _run(tiny_overrides, "resumed", "rl.max_steps=2", *common)  # resumes at iter_000002: nothing left to run
    assert _files(run_dir) == ["iter_000001.jsonl.gz", "iter_000002.jsonl.gz"]
    _run(tiny_overrides, "resumed", "rl.max_steps=4", *common)
    for name in _files(straight):
        assert _rows(run_dir / "experience" / name) == _rows(straight / "experience" / name), name  # S-CKPT-8
    # Going back to an earlier boundary sets the later files aside, kept, not deleted.
    _run(tiny_overrides, "resumed", "rl.max_steps=2", *common, resume_from="iter_000002")
    assert _files(run_dir) == ["iter_000001.jsonl.gz", "iter_000002.jsonl.gz"]
    (aside,) = (run_dir / "experience").glob("after_iter_000002.*")
    assert sorted(p.name for p in aside.iterdir()) == ["iter_000003.jsonl.gz", "iter_000004.jsonl.gz"]
    (metrics_aside,) = run_dir.glob("metrics.after_iter_000002.*.jsonl")
    assert [json.loads(line)["iteration"] for line in metrics_aside.read_text().splitlines()] == [3, 4]
