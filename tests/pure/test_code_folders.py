"""The run's code folders passed explicitly (S-BYO-3): loading a profile puts its folder
on this process's path and nothing in the environment; the launch carries the folder
and hands it to the processes Ray starts; on a joined cluster the folder's code ships
under a package name of its own, whose folder a role appends to its path, so a
`profile.py` beside the profile never hides the standard library's `profile`."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from configs.code_folders import CODE_DIRS_ENV, SHIPPED_CODE_ENV, code_dirs_of, use_run_code_dirs
from configs.loading import load_profile
from processes.code_shipping import shipped_code
from processes.ray_session import worker_env
from tests.conftest import TINY_PROFILE

PROFILE = "from configs.ppo_tiny_cpu import CONFIG\nfrom folder_helper import VALUE  # a module beside it\n"


@pytest.fixture
def own_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("folder_helper", "shipped_helper"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_loading_a_profile_puts_its_folder_last_on_the_path_and_nothing_in_the_environment(tmp_path, own_path):
    (tmp_path / "my_profile.py").write_text(PROFILE)
    (tmp_path / "folder_helper.py").write_text("VALUE = 1\n")
    environment = dict(os.environ)
    load_profile(tmp_path / "my_profile.py")  # imports the module beside it
    assert sys.path[-1] == str(tmp_path)
    assert dict(os.environ) == environment
    assert code_dirs_of(tmp_path / "my_profile.py") == (str(tmp_path),)
    assert code_dirs_of(TINY_PROFILE) == ()  # configs/ is a package of the project


def test_the_worker_environment_names_the_code_folders_it_is_handed():
    assert worker_env(("/srv/a", "/srv/b"))[CODE_DIRS_ENV] == os.pathsep.join(("/srv/a", "/srv/b"))
    assert worker_env()[CODE_DIRS_ENV] == ""


def test_a_shipped_folder_is_appended_by_name_and_shadows_no_standard_module(tmp_path, own_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "pkg").mkdir(parents=True)
    (folder / "shipped_helper.py").write_text("VALUE = 2\n")
    (folder / "profile.py").write_text("raise RuntimeError('the standard profile module was shadowed')\n")
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "outputs").mkdir()
    (folder / "outputs" / "big.bin").write_bytes(b"0" * 1024)
    (folder / "rows.jsonl").write_text("{}\n")
    with shipped_code([str(folder)]) as (py_modules, names):
        [staged] = py_modules
        assert sorted(os.listdir(staged)) == ["pkg", "profile.py", "shipped_helper.py"]  # code only
        sys.path.insert(0, str(Path(staged).parent))  # what Ray's py_modules does on a node
        monkeypatch.setenv(SHIPPED_CODE_ENV, os.pathsep.join(names))
        monkeypatch.setenv(CODE_DIRS_ENV, "")
        use_run_code_dirs()
        assert sys.path[-1] == staged
        assert importlib.import_module("shipped_helper").VALUE == 2
        assert importlib.util.find_spec("profile").origin.startswith(sys.base_prefix)
    monkeypatch.setenv(SHIPPED_CODE_ENV, "ppo_code_missing")
    with pytest.raises(ModuleNotFoundError, match="ppo_code_missing"):
        use_run_code_dirs()
