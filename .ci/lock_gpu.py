"""Resolve requirements-gpu.lock (S-DEP-1): the GPU install, pinned.

`make lock` (or `make lock-gpu`) runs this. It asks pip to resolve, without installing
anything, `vllm` as pinned by pyproject.toml's `gpu` extra together with every entry of
[project].dependencies and the `dev` extra (make test-gpu-env runs the suite), against
PyPI only, on Linux x86_64 / CPython 3.11:

    pip install --dry-run --ignore-installed --report R.json --index-url https://pypi.org/simple \
        vllm==0.32.0 torch==2.13.0 'transformers>=...' ...

and writes every package of the report as `name==version`. PyPI only, with this machine's
pip configuration switched off (PIP_CONFIG_FILE=/dev/null, no find-links, no extra index,
no constraint file): the local find-links hold torch 2.13.0+cpu, which satisfies
`torch==2.13.0` and would win over PyPI's CUDA build. On PyPI, torch 2.13.0 for
manylinux x86_64 is the CUDA build; its nvidia-*/cuda-* runtime wheels and triton come
in as its dependencies, with the exact versions its metadata pins.

Usage: python .ci/lock_gpu.py [--out requirements-gpu.lock] [--index-url URL]
       python .ci/lock_gpu.py --print-requirements [--without NAME ...]
       python .ci/lock_gpu.py --check RECORD
(the second prints those requirements on one line, for an install line:
`make test-gpu-lock-versions` installs them without vllm and torch; the third resolves
them with the lock as constraints and fails unless the lock is exactly the result)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPI = "https://pypi.org/simple"


def name_of(requirement: str) -> str:
    """The normalised project name of a requirement: `nixl-cu12` for `nixl_cu12==1.5.1`."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0]).lower()


def cuda_family(requirement: str) -> str | None:
    """`nixl` for `nixl-cu12==1.5.1`: the package a `-cuNN` build is one CUDA build of."""
    match = re.fullmatch(r"(.+)-cu\d+", name_of(requirement))
    return match.group(1) if match else None


def requirements(pyproject: Path) -> list[str]:
    """The `gpu` extra, the dev extra (test-gpu-env runs the suite) and the dependencies,
    less any dependency that is another CUDA build of a package the `gpu` extra names
    (the CPU install's nixl-cu12 where the GPU install takes nixl-cu13 for torch's CUDA)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    rebuilt = {cuda_family(r) for r in extras["gpu"]} - {None}
    dependencies = [r for r in project["dependencies"] if cuda_family(r) not in rebuilt]
    return list(extras["gpu"]) + list(extras["dev"]) + dependencies


def isolated_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    for key in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT"):  # transport settings only
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def resolve(reqs: list[str], index_url: str, *pip_options: str) -> dict:
    """pip's report of resolving `reqs` on PyPI, installing nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report_path), "--index-url", index_url, *pip_options, *reqs]
        print("lock_gpu: resolving (a few minutes):", " ".join(cmd[3:]), flush=True)
        subprocess.run(cmd, check=True, env=isolated_env())
        return json.loads(report_path.read_text())


def check(reqs: list[str], index_url: str, record: Path) -> int:
    """The resolver's proof of the lock as it is: pip resolves the requirements the lock
    was made from with the lock as constraints; the lock is a solution exactly when
    that succeeds and installs every pinned package at its pin and nothing else. The
    record is a few comment lines (make test-gpu-lock-versions puts them in
    docs/gpu-lock-proof.txt)."""
    lock = ROOT / "requirements-gpu.lock"
    pinned = {name_of(line): line.split("==", 1)[1].strip() for line in lock.read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    started = time.monotonic()
    report = resolve(reqs, index_url, "-c", str(lock))
    took = time.monotonic() - started
    resolved = {name_of(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    extra = sorted(f"{name}=={version}" for name, version in resolved.items() if pinned.get(name) != version)
    missing = sorted(f"{name}=={version}" for name, version in pinned.items() if resolved.get(name) != version)
    if extra or missing:
        print(f"lock_gpu: requirements-gpu.lock is not what pip resolves: resolved but not pinned {extra}; "
              f"pinned but not resolved {missing}", file=sys.stderr)
        return 1
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# resolver: {stamp}, pip {report.get('pip_version', '?')} install --dry-run --ignore-installed --report",
        f"#   --index-url {index_url} -c requirements-gpu.lock, with no pip configuration, of the {len(reqs)}",
        "#   requirements the lock is made from (.ci/lock_gpu.py requirements(): the gpu and dev extras",
        f"#   and the dependencies, {' '.join(r for r in reqs if cuda_family(r))} as the NIXL build):",
        f"#   resolved, for CPython 3.11 on Linux x86_64, to exactly the lock's {len(pinned)} pins (torch",
        f"#   {resolved.get('torch')} from PyPI, so its CUDA build) in {took:.0f} s. So the lock is one consistent",
        "#   solution of pyproject.toml's GPU requirements on PyPI.",
    ]
    record.write_text("\n".join(lines) + "\n")
    print(f"lock_gpu: requirements-gpu.lock is a resolution of its {len(reqs)} requirements: wrote {record}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "requirements-gpu.lock"))
    parser.add_argument("--index-url", default=PYPI)
    parser.add_argument("--print-requirements", action="store_true")
    parser.add_argument("--without", nargs="*", default=[])
    parser.add_argument("--check", metavar="RECORD",
                        help="resolve with the lock as constraints, fail unless that is the lock; record it here")
    args = parser.parse_args()

    if args.print_requirements:
        left_out = {name_of(name) for name in args.without}
        print(" ".join(r for r in requirements(ROOT / "pyproject.toml") if name_of(r) not in left_out))
        return 0

    if sys.version_info[:2] != (3, 11) or sys.platform != "linux" or platform.machine() != "x86_64":
        print(f"lock_gpu: needs CPython 3.11 on Linux x86_64 (the GPU target); this is Python "
              f"{platform.python_version()} on {sys.platform} {platform.machine()}", file=sys.stderr)
        return 2

    reqs = requirements(ROOT / "pyproject.toml")
    if args.check:
        return check(reqs, args.index_url, Path(args.check))
    report = resolve(reqs, args.index_url)

    pins: dict[str, str] = {}
    for item in report["install"]:
        meta = item["metadata"]
        pins[meta["name"]] = meta["version"]
        url = item["download_info"]["url"]
        if not url.endswith(".whl"):
            print(f"lock_gpu: warning: {meta['name']} {meta['version']} resolved to a source "
                  f"distribution ({url})", file=sys.stderr)
    by_lower = {name.lower(): version for name, version in pins.items()}
    torch = by_lower.get("torch", "")
    if "+" in torch or not any(n.startswith("nvidia-") for n in by_lower):
        print(f"lock_gpu: torch resolved to {torch!r} without the CUDA runtime wheels: not "
              "PyPI's CUDA build", file=sys.stderr)
        return 1

    pip_version = report.get("pip_version", "?")
    header = [
        "# Exact versions for the GPU install (make setup-gpu), resolved for Linux x86_64 /",
        "# CPython 3.11 against PyPI: vllm (pyproject.toml's `gpu` extra) together with every",
        "# entry of [project].dependencies and the dev extra, by",
        f"#   pip {pip_version} install --dry-run --ignore-installed --report ... \\",
        f"#       --index-url {args.index_url} {' '.join(reqs[:2])} ...",
        "# with no pip configuration (no find-links, no constraint file). torch==2.13.0 here is",
        "# PyPI's CUDA build; the nvidia-*, cuda-* and triton lines are its pinned runtime.",
        "# vLLM 0.32 caps fastapi below 0.137, so this lock has Prefect 3.7.x where the CPU lock",
        "# (requirements.lock) has Prefect 3.9; the CPU profile's proof on these versions:",
        "# docs/gpu-lock-proof.txt (make test-gpu-lock-versions).",
        "# Regenerate: make lock (writes requirements.lock and this file; .ci/lock_gpu.py)",
    ]
    lines = [f"{name}=={pins[name]}" for name in sorted(pins, key=str.lower)]
    Path(args.out).write_text("\n".join(header + lines) + "\n")
    print(f"lock_gpu: wrote {args.out}: {len(lines)} pins; torch {torch}, vllm {by_lower.get('vllm')}, "
          f"prefect {by_lower.get('prefect')}, ray {by_lower.get('ray')}, "
          f"transformers {by_lower.get('transformers')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
