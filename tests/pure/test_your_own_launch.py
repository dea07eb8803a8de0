"""What a user with their own project sees on the command line (issue 46): a profile
outside configs/, a reward module beside it, PYTHONPATH unset. Each mistake ends in
seconds on one `error:` line, before Prefect or Ray start, with nothing written."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import REPO_ROOT
from tests.support.user_project import question_rows, write_user_project

THRESHOLD_S = 30  # far above the few seconds these take, far below the 35 s a launch once took to find row 57


def _run(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m flows.ppo` from the repository, as README says, without PYTHONPATH."""
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "PREFECT_HOME": str(tmp_path / "prefect-home"),
           "HOME": str(tmp_path)}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "flows.ppo", *args], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - started


def _refused_before_anything(result, seconds: float, tmp_path, project) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr  # one line, printed once
    assert result.stdout == ""  # not even the run's first line
    assert not (project / "outputs").exists() and not (tmp_path / "prefect-home").exists()
    assert seconds < THRESHOLD_S
    return lines[0]


def test_a_bad_row_57_fails_the_plain_launch_in_seconds(tmp_path, user_models):
    rows = question_rows(64)
    rows[57] = {"prompt": "58 plus 1?", "answer": "59"}  # the user's file forgot its column in one row
    profile = write_user_project(tmp_path / "mine", user_models.plain, module="myrewards_c", rows=rows)
    result, seconds = _run(tmp_path, "--config", str(profile))
    line = _refused_before_anything(result, seconds, tmp_path, tmp_path / "mine")
    assert line.startswith("error: rl.data.prompt_key: ") and "row 57 (line 58, column 1)" in line
    assert "resume" not in result.stderr


def test_a_reward_module_beside_the_profile_imports_without_pythonpath(tmp_path, user_models):
    profile = write_user_project(tmp_path / "mine", user_models.plain, module="myrewards_d")
    result, _ = _run(tmp_path, "--config", str(profile), "--validate-manifest")
    assert result.returncode == 0, result.stderr
    assert "reward: terminal myrewards_d:score" in result.stdout and "packer: plain text" in result.stdout
    assert result.stdout.rstrip().endswith("bind_check: ok")


def test_a_reward_module_that_is_not_there_is_named_with_where_it_was_looked_for(tmp_path, user_models):
    profile = write_user_project(tmp_path / "mine", user_models.plain, module="myrewards_e")
    (tmp_path / "mine" / "myrewards_e.py").unlink()
    result, seconds = _run(tmp_path, "--config", str(profile))
    line = _refused_before_anything(result, seconds, tmp_path, tmp_path / "mine")
    assert line.startswith("error: rl.reward.terminal_callable: 'myrewards_e:score': no module named 'myrewards_e'")
    assert f"looked in {REPO_ROOT}" in line and str(tmp_path / "mine") in line
    assert "beside the profile" in line and "pip install -e" in line


def test_a_typo_in_a_profile_reads_like_the_same_typo_as_an_override(tmp_path):
    profile = tmp_path / "typo.py"
    profile.write_text(
        "from configs.ppo_tiny_cpu import CONFIG as BASE\n"
        "from configs.schema import RLConfig\n"
        "\n"
        "CONFIG = BASE.model_copy(update={'rl': RLConfig(data=BASE.rl.data, max_step=4)})\n"
    )
    result, seconds = _run(tmp_path, "--config", str(profile))
    assert result.returncode == 2 and result.stdout == "" and seconds < THRESHOLD_S
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: rl.max_step: unknown key (known here: advantage_estimator, batch_size, ")
    assert "max_steps" in line and line.endswith(f"({profile} line 4)")


def test_help_shows_the_override_form(capsys):
    import pytest

    from cli.arguments import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = capsys.readouterr().out
    assert shown.startswith("usage: python -m flows.ppo --config FILE [options] [-- key=value ...]")
    assert "-- rl.max_steps=5" in shown and "docs/howto/your-own-model.md" in shown
