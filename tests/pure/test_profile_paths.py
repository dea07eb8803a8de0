"""A flow run's `profile` parameter loads only files under configs/ or a directory the
operator names in PPO_PROFILE_DIRS (issue 16 item 8, S-SEC-2).

A profile is Python: whoever can set a deployment's parameters could otherwise run any
file on the worker. Each refusal is checked to happen before the file executes (the
profile below writes a file when it runs), and to name the parameter.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from configs.loading import PROFILE_DIRS_ENV, ConfigError, allow_profile_dir, load_config
from flows.training import resolve_config

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "configs"
TINY_PROFILE = CONFIGS / "ppo_tiny_cpu.py"


def evil_profile(directory: Path) -> tuple[Path, Path]:
    """A profile that leaves a file behind if it is ever executed (and is otherwise valid)."""
    directory.mkdir(parents=True, exist_ok=True)
    ran = directory / "profile-was-executed"
    profile = directory / "evil.py"
    profile.write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n" + TINY_PROFILE.read_text()
    )
    return profile, ran


@pytest.fixture(autouse=True)
def no_operator_dirs(monkeypatch):
    monkeypatch.setenv(PROFILE_DIRS_ENV, "")  # restored after each test, as allow_profile_dir changes it


def refused(profile: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        resolve_config(profile, None, None, None)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith("profile: "), info.value.problems
    return info.value


def test_profiles_under_configs_load_by_relative_and_absolute_path(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert resolve_config("configs/ppo_tiny_cpu.py", None, None, None).job.name == "tiny-cpu"
    assert resolve_config(str(TINY_PROFILE), None, None, None).job.name == "tiny-cpu"


def test_a_file_elsewhere_is_refused_before_it_runs(tmp_path):
    profile, ran = evil_profile(tmp_path / "elsewhere")
    error = refused(str(profile))
    assert "outside the profile directories" in str(error) and PROFILE_DIRS_ENV in str(error)
    assert not ran.exists()


def test_dotdot_out_of_configs_is_refused_before_it_runs(tmp_path):
    profile, ran = evil_profile(tmp_path / "elsewhere")
    escaping = CONFIGS / os.path.relpath(profile, CONFIGS)  # configs/../../..../evil.py
    assert str(escaping).startswith(str(CONFIGS)) and ".." in escaping.parts
    refused(str(escaping))
    assert not ran.exists()


def test_a_symlink_pointing_out_of_an_allowed_directory_is_refused(tmp_path, monkeypatch):
    profile, ran = evil_profile(tmp_path / "elsewhere")
    allowed = tmp_path / "operator-profiles"
    allowed.mkdir()
    (allowed / "looks-fine.py").symlink_to(profile)
    monkeypatch.setenv(PROFILE_DIRS_ENV, str(allowed))
    refused(str(allowed / "looks-fine.py"))
    assert not ran.exists()


def test_a_directory_the_operator_names_is_accepted(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    profile, ran = evil_profile(second)
    monkeypatch.setenv(PROFILE_DIRS_ENV, f"{first}{os.pathsep}{second}")
    assert resolve_config(str(profile), None, None, None).job.name == "tiny-cpu"
    assert ran.exists()  # accepted profiles do run: this one was trusted


def test_the_check_is_the_flow_parameter_s_and_not_every_loader_s(tmp_path):
    # The CLI, the manifest check and the bench scripts take the operator's own file.
    profile, _ = evil_profile(tmp_path)
    assert load_config(profile).job.name == "tiny-cpu"


def test_a_file_that_is_not_python_is_refused_naming_the_profile(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_DIRS_ENV, str(tmp_path))
    (tmp_path / "profile.txt").write_text("CONFIG = None\n")
    error = refused(str(tmp_path / "profile.txt"))  # before: AssertionError from the loader
    assert "not a Python file" in str(error)


def test_the_cli_lets_the_flow_load_its_own_config_file(tmp_path, monkeypatch):
    """`python -m flows.ppo --config FILE`: the operator's file, wherever it is, reaches
    the flow it starts in the same process; the flow body is replaced here by one that
    resolves the profile as the real one does and then stops."""
    import cli.command
    import flows.training
    from rundir.resume import ResumeError

    profile, _ = evil_profile(tmp_path / "mine")
    seen = []

    def flow_body(profile, overrides, resume, resume_from=None):
        seen.append(resolve_config(profile, overrides, None, None).job.name)
        raise ResumeError("stopped by the test")

    monkeypatch.setattr(flows.training, "ppo", flow_body)
    # No Ray or actors in a pure test: the CLI's start-ahead of them is not what this checks.
    monkeypatch.setattr("processes.ray_session.connect_ray", lambda config, code_dirs=(): None)
    monkeypatch.setattr("processes.temporary_api.start_temporary_api", lambda early=None: None)
    monkeypatch.setattr("processes.temporary_api.launch_early", lambda: None)
    monkeypatch.setattr("processes.actors.launch_role_actors", lambda config, code_dirs=(): None)
    monkeypatch.chdir(tmp_path)
    assert cli.command.main(["--config", str(profile), "--", f"job.output_root={tmp_path / 'out'}"]) == 2
    assert seen == ["tiny-cpu"]
    assert str((tmp_path / "mine").resolve()) in os.environ[PROFILE_DIRS_ENV].split(os.pathsep)


def test_allow_profile_dir_adds_each_directory_once(tmp_path, monkeypatch):
    allow_profile_dir(tmp_path)
    allow_profile_dir(tmp_path / ".")
    assert os.environ[PROFILE_DIRS_ENV] == str(tmp_path.resolve())


def test_one_launch_loads_the_profile_once_and_checks_the_resume_point_once(tmp_path, monkeypatch):
    """The command line builds the run's set-up once (flows/launch.py) and the flow it
    calls takes it as handed: one profile load and one resume check per launch, and
    the flow sees the very config and resume point the command line checked."""
    import cli.command
    import configs.loading
    import flows.launch
    import flows.training
    from rundir.resume import ResumeError

    loads, resume_checks, taken = [], [], []
    real_load_profile, real_resume_boundary = configs.loading.load_profile, flows.launch.resume_boundary

    def counted_load_profile(*args, **kwargs):
        loads.append(args[0])
        return real_load_profile(*args, **kwargs)

    def counted_resume_boundary(*args, **kwargs):
        resume_checks.append(kwargs)
        return real_resume_boundary(*args, **kwargs)

    def flow_body(profile, overrides, resume, resume_from=None):  # the flow's own set-up, then a stop
        taken.append(flows.training.take_launch(profile, overrides, None, None, resume=resume,
                                                resume_from=resume_from))
        raise ResumeError("stopped by the test")

    monkeypatch.setattr(configs.loading, "load_profile", counted_load_profile)
    monkeypatch.setattr(flows.launch, "resume_boundary", counted_resume_boundary)
    monkeypatch.setattr(flows.training, "ppo", flow_body)
    monkeypatch.setattr("processes.ray_session.connect_ray", lambda config, code_dirs=(): None)
    monkeypatch.setattr("processes.temporary_api.start_temporary_api", lambda early=None: None)
    monkeypatch.setattr("processes.temporary_api.launch_early", lambda: None)
    monkeypatch.setattr("processes.actors.launch_role_actors", lambda config, code_dirs=(): None)
    assert cli.command.main(["--config", str(TINY_PROFILE), "--", f"job.output_root={tmp_path / 'out'}"]) == 2
    assert len(loads) == 1 and len(resume_checks) == 1
    assert taken[0].config.job.output_root == str(tmp_path / "out") and taken[0].resume_point is None


def test_a_flow_handed_a_launch_runs_with_the_parameters_it_was_planned_from(tmp_path):
    """The `ppo` flow's parameters (what the Prefect UI shows) are what the handed launch
    was planned from; a flow called with others is refused, never silently ignored."""
    import flows.launch

    overrides = [f"job.output_root={tmp_path / 'out'}"]
    launch = flows.launch.plan_launch(str(TINY_PROFILE), overrides, None, None, resume=True, resume_from=None)
    with flows.launch.handed_to_the_flow(launch):
        taken = flows.launch.take_launch(str(TINY_PROFILE), overrides, None, None, resume=True, resume_from=None)
        assert taken is launch
        with pytest.raises(RuntimeError, match="handed a launch planned from"):
            flows.launch.take_launch(str(TINY_PROFILE), [*overrides, "rl.max_steps=3"], None, None, resume=True,
                                     resume_from=None)
