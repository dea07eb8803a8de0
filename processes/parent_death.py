"""A child process that ends when the process that started it dies, even by SIGKILL
(Linux's PR_SET_PDEATHSIG): for the processes a run starts that must not outlive it."""

from __future__ import annotations

from typing import Callable

PR_SET_PDEATHSIG = 1


def parent_death_signal_setter(signum: int) -> Callable[[], None] | None:
    """A function that, called in a child (a `preexec_fn`, or right after `os.fork`),
    makes the kernel send it `signum` when its parent dies; None where the platform has
    no such call. Resolved here, in the parent, so the child only calls it."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None

    def set_in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signum)

    return set_in_child
