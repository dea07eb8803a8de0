"""Files beside a profile named like a module Python or the run imports (issue 59 item 8,
S-BYO-3): noted by the pre-flight, naming the file and a rename, never refused; the
docs' suggested names shadow nothing."""

from __future__ import annotations

import io
import os
import re
import sys

from cli.manifest import validate_manifest
from configs.profile_folder import IMPORTED_PACKAGES, project_packages, shadowing_notes
from tests.conftest import REPO_ROOT

PROFILE = '''from configs.ppo_tiny_cpu import CONFIG as BASE

CONFIG = BASE.model_copy(update={{"job": BASE.job.model_copy(update={{"output_root": {root!r}}})}})
'''


def test_a_profile_named_like_a_standard_module_is_noted_not_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading the profile adds its folder: undone after the test
    profile = tmp_path / "profile.py"
    profile.write_text(PROFILE.format(root=str(tmp_path / "outputs")))
    (tmp_path / "myrewards.py").write_text("")
    (tmp_path / "transformers.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("")
    (tmp_path / "notes.txt").write_text("")
    out, err = io.StringIO(), io.StringIO()
    assert validate_manifest(str(profile), [], out=out, err=err) == 0, err.getvalue()
    notes = [line for line in out.getvalue().splitlines() if line.startswith("note: ") and "is named like" in line]
    assert len(notes) == 3, notes  # data/, profile.py, transformers.py; not myrewards.py or notes.txt
    assert f"note: {tmp_path / 'profile.py'} is named like Python's standard module 'profile'" in notes[1]
    assert "Rename it (e.g. my_profile.py)" in notes[1] and "fail to import transformers" in notes[1]
    assert "the package 'transformers' the run imports" in notes[2]
    assert "this project's package 'data'" in notes[0] and "`data:...`" in notes[0]


def test_the_launch_prints_the_same_notes(tmp_path, monkeypatch):
    from flows import launch
    from rundir.run_checks import ManifestReport

    profile = tmp_path / "profile.py"
    profile.write_text(PROFILE.format(root=str(tmp_path / "outputs")))
    monkeypatch.setenv("PPO_PROFILE_DIRS", str(tmp_path))  # as the command line allows its --config's folder
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading the profile adds its folder: undone after the test
    checked: dict = {}

    def require_runnable(config, *, profile=None, environ=None):
        checked["profile"] = profile
        return ManifestReport(profile_notes=shadowing_notes(profile))

    monkeypatch.setattr(launch, "require_runnable", require_runnable)
    planned = launch.plan_launch(str(profile), [], None, None, resume=False, resume_from=None)
    assert checked["profile"] == str(profile)
    assert len(planned.profile_notes) == 1 and "'profile'" in planned.profile_notes[0]
    assert planned.code_dirs == (str(tmp_path),)  # carried with the launch to every process it starts
    assert "PPO_LAUNCH_CODE_DIRS" not in os.environ  # not set by loading the profile


def test_the_projects_own_profiles_and_a_plain_folder_get_no_note(tmp_path):
    assert shadowing_notes(REPO_ROOT / "configs" / "ppo_tiny_cpu.py") == []
    (tmp_path / "my_profile.py").write_text("")
    (tmp_path / "myrewards.py").write_text("")
    assert shadowing_notes(tmp_path / "my_profile.py") == []
    assert "tests" not in project_packages() and {"data", "configs", "flows"} <= project_packages()


def test_the_docs_suggest_profile_names_that_shadow_nothing():
    names = set()
    for doc in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md")), REPO_ROOT / "Makefile"]:
        if doc.name.startswith("performance"):  # measured runs, recorded as they were typed
            continue
        names |= set(re.findall(r"my-project/(\w+)\.py", doc.read_text(encoding="utf-8")))
    assert "my_profile" in names
    shadowing = {name for name in names
                 if name in sys.stdlib_module_names or name in IMPORTED_PACKAGES or name in project_packages()}
    assert not shadowing, shadowing
