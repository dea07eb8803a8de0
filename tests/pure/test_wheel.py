"""A wheel built from the project holds every package it imports (S-DEP-3).

The project's files (`git ls-files`: the tracked ones, plus new files git does not
ignore, so uncommitted work is tested too) are copied into a scratch folder, a wheel is
built there (`pip wheel --no-deps`), and the wheel is unpacked into a fresh virtual
environment that sees the test environment's third-party packages through a .pth file
but not the repository. From a folder outside the repository, every top-level package
of the repository (every top-level folder with an __init__.py, tests/ excepted) must
import, and from the wheel's copy. Every .py file below those folders must be in the
wheel, so a subfolder without an __init__.py cannot be left out unnoticed either.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_SHIPPED = {"tests"}

IMPORT_ALL = r"""
import importlib, json, os, sys, traceback
site, names = sys.argv[1], sys.argv[2:]
out = {}
for name in names:
    try:
        module = importlib.import_module(name)
        out[name] = {"file": os.path.realpath(module.__file__ or "")}
    except BaseException:
        out[name] = {"error": traceback.format_exc(limit=3)}
print("RESULT " + json.dumps(out))
"""


def project_files(root: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    return [f for f in listed if f and (root / f).is_file()]


def copy_tree(root: Path, files: list[str], dest: Path) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def top_level_packages(tree: Path) -> list[str]:
    return sorted(p.parent.name for p in tree.glob("*/__init__.py") if p.parent.name not in NOT_SHIPPED)


def build_wheel(src: Path, out: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
           "-w", str(out), str(src)]
    try:
        import setuptools

        from packaging.version import Version

        if Version(setuptools.__version__) >= Version("68"):  # pyproject.toml's build requirement
            cmd[4:4] = ["--no-build-isolation", "--no-index"]
    except ImportError:
        pass  # pip fetches setuptools into an isolated build environment
    proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def fresh_env_with_wheel(wheel: Path, where: Path) -> tuple[Path, Path]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip())
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    # Third-party packages from the environment running this test, after the wheel's own.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_test_environment.pth").write_text("\n".join(sorted(deps)) + "\n")
    return python, site


def test_wheel_holds_and_imports_every_package(tmp_path):
    src = tmp_path / "src"
    files = project_files(ROOT)
    copy_tree(ROOT, files, src)
    packages = top_level_packages(src)
    assert {"flows", "processes", "compat", "roles", "trainer"} <= set(packages), packages

    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = build_wheel(src, dist)
    with zipfile.ZipFile(wheel) as zf:
        in_wheel = set(zf.namelist())
    expected = sorted(f for f in files if f.endswith(".py") and f.split("/", 1)[0] in packages)
    missing_files = [f for f in expected if f not in in_wheel]
    assert not [n for n in in_wheel if n.startswith("tests/")], "tests/ is not shipped"

    python, site = fresh_env_with_wheel(wheel, tmp_path / "venv")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    proc = subprocess.run([str(python), "-c", IMPORT_ALL, str(site), *packages],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"import run failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(lines[-1][len("RESULT "):])

    site_real = os.path.realpath(site) + os.sep
    problems = {}
    for name in packages:
        got = result[name]
        if "error" in got:
            problems[name] = got["error"].strip().splitlines()[-1]
        elif not got["file"].startswith(site_real):
            problems[name] = f"imported from {got['file']}, not from the wheel"
    assert not problems and not missing_files, (
        f"wheel {wheel.name}: packages that do not import from it: {problems}; "
        f".py files of the project missing from it: {missing_files[:20]}"
        f"{' ...' if len(missing_files) > 20 else ''}"
    )

