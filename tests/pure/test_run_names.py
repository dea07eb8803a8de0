"""S-SEC-5 and the tiny-model spec: a run's name and root stay where the commit
protocol can lock them, and `model.tiny` never silently yields another model."""

from __future__ import annotations

import json

import pytest

from rundir.preflight import config_problems
from configs.loading import ConfigError, load_config, load_profile
from models.tiny_spec import TINY_SPEC_FILE, write_tiny_spec

from tests.support.helpers import offline_hub_snapshot
from tests.conftest import TINY_PROFILE


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(TINY_PROFILE, overrides)
    return caught.value.problems


@pytest.mark.parametrize("name", ["../../elsewhere", "a/b", "..", ".", "with space", "/abs", "x\\y", ""])
def test_a_run_name_that_is_not_one_folder_is_refused(name):
    (problem,) = _problems([f"job.name={name}"])
    assert problem.startswith("job.name:"), problem


@pytest.mark.parametrize("name", ["tiny-cpu", "run_2.b", "A1"])
def test_a_plain_run_name_is_accepted(name):
    assert load_config(TINY_PROFILE, [f"job.name={name}"]).job.name == name


@pytest.mark.parametrize("root", ["sftp://host/runs", "hdfs://nn/runs", "memory://runs", "http://host/x"])
def test_an_output_root_the_lock_cannot_hold_is_refused_by_key(root):
    (problem,) = _problems([f"job.output_root={root}"])
    assert problem.startswith(f"job.output_root: {root!r} uses ") and "run lock" in problem


@pytest.mark.parametrize("root", ["outputs", "/tmp/runs", "file:///tmp/runs"])
def test_local_output_roots_are_accepted(root):
    assert load_config(TINY_PROFILE, [f"job.output_root={root}"]).job.output_root == root


def _built_model(folder, spec) -> str:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    write_tiny_spec(folder, spec)
    return str(folder)


def test_a_tiny_spec_other_than_the_built_one_is_refused_naming_each_key(tmp_path):
    built = _built_model(tmp_path / "tiny", load_profile(TINY_PROFILE).model.tiny)
    config = load_config(TINY_PROFILE, [
        f"model.path={built}", "model.tiny.hidden_size=256", "model.tiny.num_hidden_layers=4",
    ])
    problems = {problem.key: problem.message for problem in config_problems(config)}
    assert set(problems) == {"model.tiny.hidden_size", "model.tiny.num_hidden_layers"}
    assert problems["model.tiny.hidden_size"].startswith(f"is 256, but the model already at {built} was built with")
    assert "point model.path at a new folder" in problems["model.tiny.hidden_size"]


def test_the_same_spec_a_new_path_or_a_users_own_model_is_accepted(tmp_path):
    spec = load_profile(TINY_PROFILE).model.tiny
    built = _built_model(tmp_path / "tiny", spec)
    assert config_problems(load_config(TINY_PROFILE, [f"model.path={built}"])) == []
    fresh = load_config(TINY_PROFILE, [f"model.path={tmp_path / 'new'}", "model.tiny.hidden_size=256"])
    assert config_problems(fresh) == []  # nothing there yet: it is built from this spec
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text(json.dumps({"model_type": "qwen3"}))  # no recorded spec: taken as it is
    assert not (own / TINY_SPEC_FILE).exists()
    assert config_problems(load_config(TINY_PROFILE, [f"model.path={own}"])) == []


def test_a_hub_id_is_pinned_to_one_cached_snapshot(tmp_path, monkeypatch):
    """S-SEC-4: every role loads the snapshot of one commit, whatever the branch says later."""
    from rundir.base_model import pin_hub_model

    commit = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = offline_hub_snapshot(monkeypatch, tmp_path / "hub", "acme/tiny", commit)
    config = load_config(TINY_PROFILE, ["model.path=acme/tiny", "model.tiny=null"])
    pinned = pin_hub_model(config)
    assert pinned.model.path == str(repo / "snapshots" / commit) and pinned.model.revision == commit
    with pytest.raises(ConfigError, match=r"model.path: 'acme/tiny' at revision 'v9' is neither a local folder"):
        pin_hub_model(load_config(TINY_PROFILE, ["model.path=acme/tiny", "model.tiny=null", "model.revision=v9"]))
