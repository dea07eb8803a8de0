"""Resume through the in-process runner (flows/in_process.py): the flow's own resume
code (rundir/resume.py) and iteration program on role objects, no Prefect, no Ray.
These hold the resume contract (S-CKPT-8, S-CW-7..9) in seconds per case; the flow
runs of tests/services/test_resume.py hold it over actors."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from algorithm.metrics_catalogue import EVERY_ITERATION, WITH_CRITIC, keys_when, uncatalogued
from checkpoint.boundary_files import BoundaryCorrupt
from configs.loading import load_config
from flows.failures import StageFailed
from flows.in_process import run_in_process
from rundir.resume import ResumeError
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import boundary, metric_records, run_dir_snapshot, weights_digest, without_timings


def _config(root: Path, model_dir: str, name: str, *extra: str):
    return load_config(TINY_PROFILE, [
        f"job.output_root={root}", f"model.path={model_dir}", f"job.name={name}", "rl.batch_size=16",
        "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", "rl.save_every=2", "rl.validation=null",
        *extra,
    ])


def _run(
    root: Path, model_dir: str, name: str, *extra: str, resume: bool = True, resume_from: str | None = None
) -> Path:
    config = _config(root, model_dir, name, *extra)
    run_in_process(config, paths=RunPaths.for_config(config), resume=resume, resume_from=resume_from)
    return root / name


def _digests(run_dir: Path, iteration: int) -> tuple[str, str]:
    return tuple(weights_digest(boundary(run_dir, iteration) / role) for role in ("policy", "critic"))


@pytest.mark.parametrize("warmup, stop_after", [(0, 2), (2, 1), (2, 3)])
def test_stop_and_rerun_in_process_is_bitwise_the_uninterrupted_run(tiny_model_dir, tmp_path, warmup, stop_after):
    common = (f"rl.critic_warmup_iterations={warmup}",)
    straight = _run(tmp_path, tiny_model_dir, "straight", "rl.max_steps=4", *common)
    _run(tmp_path, tiny_model_dir, "resumed", f"rl.max_steps={stop_after}", *common)
    resumed = _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=4", *common)
    assert _digests(resumed, 4) == _digests(straight, 4)  # S-CKPT-8, through warmup too (S-CW-9)
    got = [without_timings(r) for r in metric_records(resumed)]
    assert [r["iteration"] for r in got] == [1, 2, 3, 4]  # rows after the boundary were replayed once
    assert got == [without_timings(r) for r in metric_records(straight)]


@pytest.mark.parametrize("warmup, stop_after", [(0, 2), (2, 1)])
def test_the_adaptive_kl_coefficient_resumes_exactly(tiny_model_dir, tmp_path, warmup, stop_after):
    """S-OPT-1: the controller's coefficient is the policy role's saved state, so a resume
    continues it bit for bit; it steps during critic warmup too (every batch is penalised)."""
    common = (f"rl.critic_warmup_iterations={warmup}", "rl.kl_target=0.001", "rl.kl_horizon=50",
              "rl.kl_estimator=k3")
    straight = _run(tmp_path, tiny_model_dir, "straight", "rl.max_steps=4", *common)
    _run(tmp_path, tiny_model_dir, "resumed", f"rl.max_steps={stop_after}", *common)
    resumed = _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=4", *common)
    assert _digests(resumed, 4) == _digests(straight, 4)
    got = [without_timings(r) for r in metric_records(resumed)]
    assert got == [without_timings(r) for r in metric_records(straight)]
    coefficients = [r["train/kl_coef"] for r in got]
    assert len(set(coefficients)) == 4, coefficients  # it moved every iteration, warmup included
    saved = json.loads((boundary(resumed, 4) / "policy" / "trainer_state.json").read_text())
    assert saved["kl_coef"] != coefficients[-1]  # the step after iteration 4, for iteration 5


def test_resume_under_a_different_warmup_fails_closed_and_writes_nothing(tiny_model_dir, tmp_path):
    run_dir = _run(tmp_path, tiny_model_dir, "mismatch", "rl.max_steps=2", "rl.critic_warmup_iterations=2")
    before = run_dir_snapshot(run_dir)
    with pytest.raises(ResumeError, match=r"rl.critic_warmup_iterations=2 .*configured with 3"):
        _run(tmp_path, tiny_model_dir, "mismatch", "rl.max_steps=4", "rl.critic_warmup_iterations=3")
    assert run_dir_snapshot(run_dir) == before


def test_resume_under_another_loss_aggregation_is_refused_but_a_token_budget_may_change(tiny_model_dir, tmp_path):
    """S-PATH-2: the aggregation is the objective, part of the plan's shape (S-FLOW-4);
    rl.micro_batch_tokens only changes how a minibatch is computed."""
    run_dir = _run(tmp_path, tiny_model_dir, "objective", "rl.max_steps=2")
    before = run_dir_snapshot(run_dir)
    with pytest.raises(ResumeError, match=r"loss aggregation\) = \(1, 8, 8, 'token_mean'\), this run is configured "
                       r"with \(1, 8, 8, 'sequence_mean_token_sum'\)"):
        _run(tmp_path, tiny_model_dir, "objective", "rl.max_steps=4", "rl.loss_aggregation=sequence_mean_token_sum")
    assert run_dir_snapshot(run_dir) == before
    _run(tmp_path, tiny_model_dir, "objective", "rl.max_steps=3", "rl.micro_batch_tokens=64")
    assert [r["iteration"] for r in metric_records(run_dir)] == [1, 2, 3]
    assert 0.0 <= metric_records(run_dir)[-1]["perf/padding_fraction"] < 1.0


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_fused"])
def test_saving_during_warmup_never_changes_the_actor(tiny_model_dir, tmp_path, optimizer):
    """S-CW-7: saves at warmup iterations 1 and 2 vs none: the actor after its first
    real update (iteration 3) is bitwise the same."""
    common = ("rl.max_steps=3", f"rl.optimizer.name={optimizer}", "rl.critic_warmup_iterations=2")
    saving = _run(tmp_path, tiny_model_dir, "saving", *common, "rl.save_every=1")
    silent = _run(tmp_path, tiny_model_dir, "silent", *common, "rl.save_every=0")
    assert boundary(saving, 1).exists() and not boundary(silent, 1).exists()
    assert weights_digest(boundary(saving, 3) / "policy") == weights_digest(boundary(silent, 3) / "policy")


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _change_one_byte(path: Path) -> None:
    payload = bytearray(path.read_bytes())
    payload[-1] ^= 0x01  # same size: only the digest can tell
    path.write_bytes(bytes(payload))


@pytest.mark.parametrize("relative, damage, message", [
    ("policy/model.safetensors", _truncate, r"is \d+ bytes, its _SUCCESS records \d+"),
    ("policy/model.safetensors", _change_one_byte, "does not match the sha256"),
    ("critic/optimizer.pt", Path.unlink, "is missing"),
])
def test_a_damaged_file_in_the_latest_boundary_is_refused_naming_it_and_writing_nothing(
    tiny_model_dir, tmp_path, relative, damage, message
):
    """S-FAULT-3: before any role loads, not `SafetensorError: incomplete metadata`
    from inside PolicyRole.load()."""
    run_dir = _run(tmp_path, tiny_model_dir, "damaged", "rl.max_steps=2")
    damage(boundary(run_dir, 2) / relative)
    before = run_dir_snapshot(run_dir)
    # S-CKPT-9: the way back is named (here, that there is none), never taken silently.
    with pytest.raises(BoundaryCorrupt, match=rf"iter_000002: {relative} {message}.*No earlier boundary .* verifies"):
        _run(tmp_path, tiny_model_dir, "damaged", "rl.max_steps=4")
    assert run_dir_snapshot(run_dir) == before


def test_resume_from_an_earlier_boundary_ends_as_the_uninterrupted_run(tiny_model_dir, tmp_path):
    """Iterations 5..6 first ran with another kl_coef (the branch to abandon); going
    back to iter_000004 (and stopping there) moves the pointer back and sets the
    abandoned rows aside; the rerun replays 5..6 as the straight run did and commits
    iter_000006 over the old one."""
    common = ("rl.max_steps=6", "rl.keep_optim_last=2")
    straight = _run(tmp_path, tiny_model_dir, "straight", *common)
    _run(tmp_path, tiny_model_dir, "back", "rl.max_steps=4", "rl.keep_optim_last=2")
    run_dir = _run(tmp_path, tiny_model_dir, "back", *common, "rl.kl_coef=0.5")
    abandoned = metric_records(run_dir)[4:]
    assert _digests(run_dir, 6) != _digests(straight, 6)  # the branch really differs
    old_marker = (boundary(run_dir, 6) / "_SUCCESS").read_bytes()
    # Stopped right after going back: the pointer follows, the old iter_000006 is untouched.
    _run(tmp_path, tiny_model_dir, "back", "rl.max_steps=4", "rl.keep_optim_last=2", resume_from="iter_000004")
    assert (run_dir / "checkpoints" / "latest_checkpoint.txt").read_text() == "iter_000004\n"
    assert (boundary(run_dir, 6) / "_SUCCESS").read_bytes() == old_marker
    _run(tmp_path, tiny_model_dir, "back", *common)  # a plain rerun continues the new branch
    assert _digests(run_dir, 6) == _digests(straight, 6)  # S-CKPT-8 through a go-back
    got = [without_timings(r) for r in metric_records(run_dir)]
    assert [r["iteration"] for r in got] == [1, 2, 3, 4, 5, 6]  # each iteration once
    assert got == [without_timings(r) for r in metric_records(straight)]
    (aside,) = run_dir.glob("metrics.after_iter_000004.*.jsonl")
    assert [json.loads(line) for line in aside.read_text().splitlines()] == abandoned
    assert (run_dir / "checkpoints" / "latest_checkpoint.txt").read_text() == "iter_000006\n"


def test_resume_from_a_boundary_that_was_never_committed_is_refused_listing_the_committed(tiny_model_dir, tmp_path):
    run_dir = _run(tmp_path, tiny_model_dir, "named", "rl.max_steps=4", "rl.keep_optim_last=0")
    (run_dir / "checkpoints" / "iter_000005").mkdir()  # a folder without _SUCCESS
    before = run_dir_snapshot(run_dir)
    for name in ("iter_000003", "iter_000005"):
        refused = rf"resume_from='{name}': .* committed boundaries: iter_000002, iter_000004"
        with pytest.raises(ResumeError, match=refused):
            _run(tmp_path, tiny_model_dir, "named", "rl.max_steps=6", resume_from=name)
    with pytest.raises(ResumeError, match="cannot be combined with a fresh start"):
        _run(tmp_path, tiny_model_dir, "named", "rl.max_steps=6", resume=False, resume_from="iter_000002")
    assert run_dir_snapshot(run_dir) == before


def test_resume_from_a_boundary_whose_optimizer_retention_removed_is_refused_naming_retention(tiny_model_dir, tmp_path):
    run_dir = _run(tmp_path, tiny_model_dir, "pruned", "rl.max_steps=4")  # keep_optim_last unset: newest only
    before = run_dir_snapshot(run_dir)
    with pytest.raises(BoundaryCorrupt, match=r"iter_000002: critic/optimizer.pt was removed by retention"):
        _run(tmp_path, tiny_model_dir, "pruned", "rl.max_steps=6", resume_from="iter_000002")
    assert run_dir_snapshot(run_dir) == before


class _FailingFileSystem(LocalFileSystem):
    """The local disk, except that writing one file raises after `limit` bytes, like a
    disk that fills up or a mount that goes away mid-save."""

    protocol = "failafter"
    target = "iter_000004/policy/model.safetensors"
    limit = 100

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("failafter://") if isinstance(path, str) else path)

    def _open(self, path, mode="rb", **kwargs):
        handle = super()._open(path, mode, **kwargs)
        if "w" in mode and str(path).endswith(self.target):
            write, written = handle.write, [0]

            def failing_write(data):
                written[0] += len(data)
                if written[0] > self.limit:
                    raise OSError(28, "No space left on device")
                return write(data)

            handle.write = failing_write
        return handle


def test_a_save_failing_part_way_fails_the_commit_naming_role_and_path_and_keeps_the_previous_boundary(
    tiny_model_dir, tmp_path, monkeypatch
):
    """S-FAULT-1, S-CKPT-2: no _SUCCESS, the pointer unchanged, iter_000002 resumable."""
    fsspec.register_implementation("failafter", _FailingFileSystem, clobber=True)
    # The run lock reads a URL output root as a local path relative to the working
    # directory (a `failafter:` folder): here, not in the repository.
    monkeypatch.chdir(tmp_path)
    straight = _run(tmp_path / "straight", tiny_model_dir, "run", "rl.max_steps=4")
    config = _config(tmp_path, tiny_model_dir, "run", "rl.max_steps=4")
    # A user's config may not name this scheme (the run lock cannot hold it, S-SEC-5): the
    # test swaps it in past validation to put a failing disk under the commit.
    config = config.model_copy(update={"job": config.job.model_copy(update={"output_root": f"failafter://{tmp_path}"})})
    named = r"commit\[iter=4\] failed: RoleSaveFailed: policy: writing \S+/iter_000004/policy/model.safetensors failed"
    with pytest.raises(StageFailed, match=named):
        run_in_process(config, paths=RunPaths.for_config(config), resume=True)
    run_dir = tmp_path / "run"
    assert (run_dir / "checkpoints" / "latest_checkpoint.txt").read_text() == "iter_000002\n"
    assert not (boundary(run_dir, 4) / "_SUCCESS").exists()
    _run(tmp_path, tiny_model_dir, "run", "rl.max_steps=4")  # resumes from iter_000002
    assert _digests(run_dir, 4) == _digests(straight, 4)


def test_rows_of_an_attempt_killed_before_its_first_commit_are_not_repeated(tiny_model_dir, tmp_path):
    """S-FAULT-2: a run killed in iteration 2 before any commit left row 1; the rerun
    starts from scratch and metrics.jsonl holds each iteration once."""
    straight = _run(tmp_path, tiny_model_dir, "straight", "rl.max_steps=2")
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    (killed_dir / "metrics.jsonl").write_text((straight / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    _run(tmp_path, tiny_model_dir, "killed", "rl.max_steps=2")
    assert [r["iteration"] for r in metric_records(killed_dir)] == [1, 2]


def test_a_critic_free_run_commits_no_critic_and_resumes_exactly(tiny_model_dir, tmp_path):
    """S-OPT-2: a critic-free estimator starts, trains and commits no critic; its runs
    resume bit for bit, and a resume under another estimator is refused, writing nothing."""
    common = ("rl.advantage_estimator=reinforce_plus_plus",)
    config = _config(tmp_path, tiny_model_dir, "straight", "rl.max_steps=3", *common)
    records, roles = run_in_process(config, paths=RunPaths.for_config(config))
    straight = tmp_path / "straight"
    assert roles.critic is None and roles.critic_ranks() == []
    assert sorted(p.name for p in boundary(straight, 2).iterdir() if p.is_dir()) == ["data", "policy"]
    assert keys_when(WITH_CRITIC) & records[-1].keys() == set()  # the catalogue's critic keys, and only those
    assert keys_when(EVERY_ITERATION) - records[-1].keys() == set() and uncatalogued(records) == []
    marker = json.loads((boundary(straight, 2) / "_SUCCESS").read_text())
    assert marker["role_steps"] == {"policy": 4}  # two minibatches an iteration
    _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=2", *common)
    resumed = _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=3", *common)
    assert weights_digest(boundary(resumed, 3) / "policy") == weights_digest(boundary(straight, 3) / "policy")
    assert [without_timings(r) for r in metric_records(resumed)] == [without_timings(r) for r in records]
    before = run_dir_snapshot(resumed)
    with pytest.raises(ResumeError, match="written with rl.advantage_estimator=reinforce_plus_plus but this run is "
                       "configured with rl.advantage_estimator=gae"):
        _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=4")
    assert run_dir_snapshot(resumed) == before
