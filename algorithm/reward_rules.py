"""The terminal reward rules as pure string functions, and the registry naming them.

A rule answers one question, is this completion correct? (S-REW-1), as a bool;
`rewards.terminal_reward` puts it on PPO's scale. Adding a rule is one place: a function
under `@reward_rule(...)`, whose entry also writes its row of docs/reference/reward-rules.md
(`python -m algorithm.reward_rules > docs/reference/reward-rules.md`). Rules never execute model text: the
countdown rule's equation goes through algorithm/answer_parsing.py's parser, and any
failure is "not correct".
The shared types live here, not in `rewards.py`, because `python -m algorithm.rewards`
runs that module as `__main__`: a user's callable must see the classes the CLI builds.
"""

from __future__ import annotations

import sys
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


@dataclass(frozen=True)
class RewardRule:
    """One registry entry: a rule's name, whether it is PPO's own matcher or a shared
    rule (S-REW-1; a `terminal_callable` may override only PPO's own), whether it needs
    the ground truth (S-REW-2), when it counts a completion correct, in the words of
    the docs table, and its function (None for `none`: no terminal reward)."""

    name: str
    ppo_own: bool
    needs_reference: bool
    correct_when: str
    match: Callable[[RewardContext], bool | float] | None

    def matcher(self) -> TerminalMatcher | None:
        return None if self.match is None else TerminalMatcher(self.name, self.needs_reference, self.match)


RULES: dict[str, RewardRule] = {}  # name -> entry, in the order the docs list them


def reward_rule(
    name: str, *, correct_when: str, needs_reference: bool = True, ppo_own: bool = False
) -> Callable[[Callable[[RewardContext], bool | float]], Callable[[RewardContext], bool | float]]:
    """Registers the decorated function as the rule `name` (`rl.reward.terminal=name`)."""

    def register(match: Callable[[RewardContext], bool | float]) -> Callable[[RewardContext], bool | float]:
        if name in RULES:
            raise ValueError(f"reward rule {name!r} is registered twice")
        RULES[name] = RewardRule(name, ppo_own, needs_reference, correct_when, match)
        return match

    return register


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


@reward_rule(
    "arithmetic_exact_match", ppo_own=True,
    correct_when="the completion with surrounding whitespace stripped is only an integer (optional leading `-`) "
    "equal to the reference: `\"12\"` or `\" -7\\n\"`, but not `\"12.\"`, `\"+12\"` or `\"The answer is 12\"`",
)
def match_arithmetic_exact(ctx: RewardContext) -> bool:
    """PPO's own default: the completion is nothing but the reference integer."""
    expected = parse_integer(_reference(ctx, "arithmetic_exact_match"))
    got = parse_integer(ctx.completion)
    return expected is not None and got == expected


@reward_rule(
    "arithmetic",
    correct_when="the first number anywhere in the completion equals the reference integer. Negative numbers count "
    "(`\"x = -5\"`); `5-3` reads as 5 then 3; `1,234` is one number; `2.5` is 2.5, not the integer 2",
)
def match_arithmetic(ctx: RewardContext) -> bool:
    """The first number anywhere in the completion is the reference integer.

    "The first number" means the first number token, so "2.5 then 3" answers 2.5
    (not the integer 2) and "1,234" answers 1234 (not 1).
    """
    expected = parse_integer(_reference(ctx, "arithmetic"))
    numbers = number_tokens(ctx.completion)
    return expected is not None and bool(numbers) and numbers[0] == expected


@reward_rule(
    "gsm8k",
    correct_when="the first number after the last `####`, or the last number in the text if there is no `####`, "
    "equals the reference numerically. Commas (`1,234`), a trailing period (`72.`), a `$` and `72.0` vs `72` are all "
    "fine. The reference may be a full gsm8k solution ending in `#### 72`. A `####` with no number after it is an "
    "empty answer",
)
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


@reward_rule(
    "countdown",
    correct_when="the completion has an equation that uses numbers from the row's `numbers` field, each at most "
    "once, and that evaluates exactly to the target, the reference (docs/rewards.md, \"countdown in detail\")",
)
def match_countdown(ctx: RewardContext) -> bool:
    """The countdown game; the target is the reference, the numbers come from the row."""
    target = parse_integer(_reference(ctx, "countdown"))
    if target is None:
        return False
    return countdown_correct(ctx.completion, _countdown_numbers(ctx.metadata), target)


@reward_rule("exact_match", correct_when="`completion.strip() == reference.strip()` (case-sensitive)")
def match_exact(ctx: RewardContext) -> bool:
    return ctx.completion.strip() == _reference(ctx, "exact_match").strip()


@reward_rule("nonempty", needs_reference=False, correct_when="the completion has a non-whitespace character")
def match_nonempty(ctx: RewardContext) -> bool:
    return ctx.completion.strip() != ""


@reward_rule(
    "constant", needs_reference=False,
    correct_when="always; useful for plumbing checks where only the KL and process terms should move",
)
def match_constant(ctx: RewardContext) -> bool:
    """Always correct: a plumbing check where only the KL and process terms move."""
    return True


RULES["none"] = RewardRule(  # PPO's own "no terminal reward": resolves to no matcher
    "none", ppo_own=True, needs_reference=False, correct_when="there is no terminal reward; the term is 0.0", match=None
)

# S-REW-1: PPO's own names first, then the shared rules, each in the order registered.
PPO_RULE_NAMES: tuple[str, ...] = tuple(name for name, rule in RULES.items() if rule.ppo_own)
SHARED_RULE_NAMES: tuple[str, ...] = tuple(name for name, rule in RULES.items() if not rule.ppo_own)
RULE_NAMES: tuple[str, ...] = PPO_RULE_NAMES + SHARED_RULE_NAMES


def render() -> str:
    """docs/reference/reward-rules.md, from RULES."""
    from configs.reference_doc import reference_page  # pydantic, for the doc only
    from configs.schema import RewardConfig

    default = RewardConfig.model_fields["terminal"].default
    kinds, needs = {True: "PPO's own", False: "shared"}, {True: "yes", False: "no"}
    return reference_page(
        "Reward rules reference",
        [
            "Generated from `algorithm/reward_rules.py` by `python -m algorithm.reward_rules`; do not edit by hand.",
            f"`rl.reward.terminal` names one of these rules (default `{default}`). A rule that needs the reference",
            "makes the framework fill it from the data's `rl.data.reference_key` column, and pre-flight then requires",
            "that column. `rl.reward.terminal_callable` may override only PPO's own rules (docs/rewards.md).",
        ],
        ["rule", "kind", "needs reference", "correct when"],
        [
            f"| `{rule.name}` | {kinds[rule.ppo_own]} | {needs[rule.needs_reference]} | {rule.correct_when} |"
            for rule in (RULES[name] for name in RULE_NAMES)
        ],
    )


if __name__ == "__main__":
    sys.stdout.write(render())
