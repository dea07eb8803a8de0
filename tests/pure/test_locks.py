"""The two locks against pyproject.toml and against the record of what ran (S-DEP-1).

requirements.lock is the CPU install (`make setup`), requirements-gpu.lock the GPU
install (`make setup-gpu`); `make lock` writes both. docs/gpu-lock-proof.txt is written
by `make test-gpu-lock-versions` after the CPU profile ran (two iterations, then a
resume to the third) in an environment holding the GPU lock's versions with torch's CPU
build: when the GPU lock moves a package that environment had, the record no longer
matches and this test fails until the proof is rerun.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CPU_LOCK = ROOT / "requirements.lock"
GPU_LOCK = ROOT / "requirements-gpu.lock"
PROOF = ROOT / "docs" / "gpu-lock-proof.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;#]*)$")
# The versions docs/launch.md names as proven on the CPU profile with the GPU lock.
PROVEN = ("prefect", "ray", "transformers", "fastapi", "starlette", "uvicorn", "pydantic", "tokenizers")
# pyproject.toml's lower bound for each is the lowest version either lock pins.
TESTED_FLOORS = ("prefect", "ray", "transformers", "tokenizers", "pydantic")
TOOLS = {"pip", "setuptools", "wheel"}


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{path.name}:{n}: {line!r} is not a `name==version` pin"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{path.name}:{n}: {name} pinned twice"
        pins[name] = match.group(2)
    return pins


def ci_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / ".ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def direct(extra: str | None = None) -> dict[str, Requirement]:
    """What a lock was resolved from: the dependencies and the dev extra; for the `gpu`
    extra, the requirements .ci/lock_gpu.py resolves (its NIXL build replaces the CPU one)."""
    if extra == "gpu":
        reqs = [Requirement(d) for d in ci_module("lock_gpu").requirements(ROOT / "pyproject.toml")]
    else:
        reqs = [Requirement(d) for d in project()["dependencies"] + project()["optional-dependencies"]["dev"]]
    return {canonicalize_name(r.name): r for r in reqs}


def test_each_lock_pins_one_nixl_build_for_its_cuda():
    """The CPU lock keeps NIXL's CUDA 12 build (it loads without a GPU); the GPU lock's
    must match the CUDA 13 runtime its torch pins."""
    cpu, gpu = read_pins(CPU_LOCK), read_pins(GPU_LOCK)
    assert [name for name in cpu if name.startswith("nixl")] == ["nixl-cu12"]
    assert [name for name in gpu if name.startswith("nixl")] == ["nixl-cu13"]
    assert gpu["nvidia-cuda-runtime"].startswith("13.") and gpu["nixl-cu13"] == cpu["nixl-cu12"]


@pytest.mark.parametrize("lock, extra", [(CPU_LOCK, None), (GPU_LOCK, "gpu")], ids=["cpu", "gpu"])
def test_every_pin_satisfies_pyproject(lock, extra):
    pins = read_pins(lock)
    problems = []
    for name, req in direct(extra).items():
        if name not in pins:
            problems.append(f"{name}: not in {lock.name}")
        elif not req.specifier.contains(Version(pins[name]), prereleases=True):
            problems.append(f"{name}=={pins[name]} outside pyproject.toml's {req}")
    assert not problems, problems


def test_gpu_lock_pins_the_gpu_stack():
    pins = read_pins(GPU_LOCK)
    for name in ("vllm", "torch", "ray", "prefect", "transformers", "triton"):
        assert name in pins, f"{name} missing from {GPU_LOCK.name}"
    assert pins["vllm"] == "0.32.0"
    assert pins["torch"] == "2.13.0"  # PyPI's CUDA build: no local label such as +cpu
    assert any(n.startswith("nvidia-") for n in pins), "the CUDA runtime wheels (nvidia-*) are missing"
    assert "regenerate: make lock" in GPU_LOCK.read_text().lower()


def test_cpu_lock_is_the_cpu_install():
    pins = read_pins(CPU_LOCK)
    assert pins["torch"] == "2.13.0"
    assert "vllm" not in pins and not any(n.startswith("nvidia-") for n in pins)


def test_lower_bounds_are_tested_versions():
    cpu, gpu = read_pins(CPU_LOCK), read_pins(GPU_LOCK)
    deps = direct()
    for name in TESTED_FLOORS:
        floors = [Version(s.version) for s in deps[name].specifier if s.operator in (">=", "==")]
        assert floors, f"{name}: pyproject.toml gives no lower bound"
        lowest = min(Version(cpu[name]), Version(gpu[name]))
        assert max(floors) == lowest, (
            f"{name}: pyproject.toml's lower bound {max(floors)} is not the lowest locked (tested) version {lowest}"
        )


def test_gpu_lock_matches_the_recorded_proof():
    text = PROOF.read_text()
    recorded = read_pins(PROOF)
    gpu = read_pins(GPU_LOCK)
    assert "resume: from" in text and "done: run gpu-lock-proof at policy_version 3" in text
    # The same two runs against the lock's Prefect server on PostgreSQL (S-TEAM-1).
    assert "done: run gpu-lock-proof-postgres at policy_version 3" in text
    assert "both flow runs read back from that server: COMPLETED, COMPLETED" in text
    # The resolver's proof (.ci/lock_gpu.py --check) of this lock: as many pins as it has now.
    assert "# resolver:" in text and f"to exactly the lock's {len(gpu)} pins" in text
    assert recorded.get("torch", "").endswith("+cpu"), "the proof ran on torch's CPU build"
    moved = {name: (version, gpu.get(name)) for name, version in recorded.items()
             if name != "torch" and name not in TOOLS and gpu.get(name) != version}
    assert not moved, (
        f"requirements-gpu.lock differs from the environment the CPU profile was proven on "
        f"(recorded, lock): {moved}; rerun `make test-gpu-lock-versions` and commit {PROOF.name}"
    )
    assert all(name in recorded for name in PROVEN)


def test_docs_name_the_proven_versions():
    gpu = read_pins(GPU_LOCK)
    launch = (ROOT / "docs" / "launch.md").read_text()
    for name in ("prefect", "ray", "transformers"):
        assert f"{name} {gpu[name]}" in launch.lower(), f"docs/launch.md does not name {name} {gpu[name]}"


def test_constraints_for_cpu_torch_keep_the_gpu_versions():
    module = ci_module("gpu_lock_constraints")
    kept = {canonicalize_name(line.split("==")[0]): line.split("==")[1] for line in module.constraint_lines()}
    assert not [n for n in kept if n in ("torch", "vllm", "triton") or n.startswith(("nvidia-", "cuda-"))]
    gpu = read_pins(GPU_LOCK)
    assert all(kept[name] == gpu[name] for name in PROVEN)
    assert "setuptools" not in {canonicalize_name(line.split("==")[0])
                                for line in module.constraint_lines(drop=("setuptools",))}
