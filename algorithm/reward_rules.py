"""The terminal reward rules as pure string functions, and the registry naming them.

A rule answers one question, is this completion correct? (S-REW-1), as a bool;
`rewards.terminal_reward` puts it on PPO's scale. Rules never execute model text: the
countdown rule's equation goes through algorithm/answer_parsing.py's parser, and any
failure is "not correct".
The shared types live here, not in `rewards.py`, because `python -m algorithm.rewards`
runs that module as `__main__`: a user's callable must see the classes the CLI builds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from algorithm.answer_parsing import countdown_correct, gsm8k_answer, number_tokens, parse_integer


@dataclass(frozen=True)
class RewardContext:
    """Everything a rule may look at for one completion.

    `reference` is filled by the framework only when the rule declares
    `needs_reference` (S-REW-2); a rule that does not need it must not read it.
    """

    prompt: str | list  # the projected prompt, untouched (string or chat messages)
    completion: str  # decoded generated text, special tokens removed
    reference: str | None = None  # ground truth from the data's reference column
    metadata: Mapping[str, Any] = field(default_factory=dict)  # other row fields


@dataclass(frozen=True)
class TerminalMatcher:
    """A resolved `rl.reward.terminal` (or `terminal_callable`) ready to score.

    `match` returns True / 1.0 for a correct completion; a float in [0, 1] is a
    partial score that `terminal_reward` interpolates on PPO's scale.
    """

    name: str  # rule name, or the "package.module:callable" path
    needs_reference: bool  # S-REW-2: drives reference filling and manifest validation
    match: Callable[[RewardContext], bool | float]


# --- the rules over a RewardContext ---------------------------------------------------


def _reference(ctx: RewardContext, rule: str) -> str:
    # S-REW-2 promises a filled reference for these rules; None here is a wiring bug
    # in the framework or a test, so it is loud instead of a silent zero reward.
    if ctx.reference is None:
        raise ValueError(
            f"rule {rule!r} needs a reference but RewardContext.reference is None; "
            "set rl.data.reference_key to the row key holding the ground truth"
        )
    return str(ctx.reference)


def match_arithmetic_exact(ctx: RewardContext) -> bool:
    """PPO's own default: the completion is nothing but the reference integer."""
    expected = parse_integer(_reference(ctx, "arithmetic_exact_match"))
    got = parse_integer(ctx.completion)
    return expected is not None and got == expected


def match_arithmetic(ctx: RewardContext) -> bool:
    """The first number anywhere in the completion is the reference integer.

    "The first number" means the first number token, so "2.5 then 3" answers 2.5
    (not the integer 2) and "1,234" answers 1234 (not 1).
    """
    expected = parse_integer(_reference(ctx, "arithmetic"))
    numbers = number_tokens(ctx.completion)
    return expected is not None and bool(numbers) and numbers[0] == expected


def match_gsm8k(ctx: RewardContext) -> bool:
    """gsm8k's final answer compared numerically; the reference may be a full
    gsm8k solution ("... #### 72") or just the number."""
    expected = gsm8k_answer(_reference(ctx, "gsm8k"))
    got = gsm8k_answer(ctx.completion)
    return expected is not None and got is not None and got == expected


def _countdown_numbers(metadata: Mapping[str, Any]) -> list[int]:
    numbers = metadata.get("numbers")
    if numbers is None:
        raise ValueError(
            'rule "countdown" needs metadata["numbers"], the integers the equation may use '
            f"(e.g. [3, 5, 7]); the row has keys {sorted(metadata)}"
        )
    if isinstance(numbers, str):
        numbers = numbers.replace(",", " ").split()
    try:
        return [int(number) for number in numbers]
    except (TypeError, ValueError) as error:
        raise ValueError(
            f'rule "countdown": metadata["numbers"] must be a list of integers (e.g. [3, 5, 7]), got {numbers!r}'
        ) from error


def match_countdown(ctx: RewardContext) -> bool:
    """The countdown game; the target is the reference, the numbers come from the row."""
    target = parse_integer(_reference(ctx, "countdown"))
    if target is None:
        return False
    return countdown_correct(ctx.completion, _countdown_numbers(ctx.metadata), target)


def match_exact(ctx: RewardContext) -> bool:
    return ctx.completion.strip() == _reference(ctx, "exact_match").strip()


def match_nonempty(ctx: RewardContext) -> bool:
    return ctx.completion.strip() != ""


def match_constant(ctx: RewardContext) -> bool:
    """Always correct: a plumbing check where only the KL and process terms move."""
    return True


# S-REW-1 / S-REW-2: name -> matcher. `none` is not here: it resolves to no matcher.
RULES: dict[str, TerminalMatcher] = {
    "arithmetic_exact_match": TerminalMatcher("arithmetic_exact_match", True, match_arithmetic_exact),
    "arithmetic": TerminalMatcher("arithmetic", True, match_arithmetic),
    "gsm8k": TerminalMatcher("gsm8k", True, match_gsm8k),
    "countdown": TerminalMatcher("countdown", True, match_countdown),
    "exact_match": TerminalMatcher("exact_match", True, match_exact),
    "nonempty": TerminalMatcher("nonempty", False, match_nonempty),
    "constant": TerminalMatcher("constant", False, match_constant),
}

PPO_RULE_NAMES: tuple[str, ...] = ("arithmetic_exact_match", "none")  # PPO's own (S-REW-1)
SHARED_RULE_NAMES: tuple[str, ...] = ("arithmetic", "gsm8k", "countdown", "exact_match", "nonempty", "constant")
RULE_NAMES: tuple[str, ...] = PPO_RULE_NAMES + SHARED_RULE_NAMES
