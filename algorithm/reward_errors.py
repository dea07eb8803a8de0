"""A reward rule or callable that raises on a completion (S-BYO-3, `rl.reward.on_error`).

User code meets completions no test showed it (an empty string, a half-written number),
so its failure is reported with everything needed to reproduce it: the callable, the
exception, the row and the completion, shortened. `fail` (the default) ends the run
with that; `zero` scores the completion as incorrect and counts it.
"""

from __future__ import annotations

from contracts.faults import RepeatsOnRerun

SHOWN_CHARACTERS = 80  # of a completion in a message: enough to recognise it, short enough for one line
LOGGED_ERRORS = 3  # per role, with `on_error=zero`: the first few are logged, the rest only counted


class RewardCallableFailed(RuntimeError, RepeatsOnRerun):
    """The terminal rule or callable raised; a rerun would raise again on the same row."""


def shortened(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def describe_reward_error(matcher_name: str, error: Exception, row_id: int, source: str | None, completion: str) -> str:
    where = f"row {row_id}" + (f" ({source})" if source else "")
    return (
        f"reward {matcher_name!r} raised {type(error).__name__}: {error} on {where}, completion {shortened(completion)}"
    )


def failed(description: str) -> RewardCallableFailed:
    return RewardCallableFailed(
        f"{description}; fix the reward function (try it on that completion), or set rl.reward.on_error=zero to "
        "score such completions as incorrect and count them in reward/errors"
    )
