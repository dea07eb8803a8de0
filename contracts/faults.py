"""Which failures a rerun would repeat (S-BYO-3).

A dead actor, a hung stage or a stop is gone on the next attempt, so those end with
the resume hint; a reward callable that raises, a bad row or a model folder without
a tokenizer fail the same way every time, so those end with what to fix instead,
and no automatic resume retries them. The classes that mean "fix this first" inherit
`RepeatsOnRerun`; the flow asks `repeats_on_rerun` and never parses messages.
"""

from __future__ import annotations


REWARD_EVENTS = "reward/error_events"  # [[level, message], ...]: logged by the stage's task, never a metric


class RepeatsOnRerun(Exception):
    """A failure in the user's code, data, model folder or config; its message names
    what to fix."""


def repeats_on_rerun(error: BaseException | None) -> bool:
    """True when `error`, or an exception it was raised from, repeats on a rerun."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, RepeatsOnRerun):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
