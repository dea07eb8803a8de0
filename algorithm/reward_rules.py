"""The terminal reward rules as pure string functions, and the registry naming them.

A rule answers one question, is this completion correct? (S-REW-1), as a bool;
`rewards.terminal_reward` puts it on PPO's scale. Rules never execute model text: the
countdown rule's equation goes through the parser below, and any failure is "not correct".
The shared types live here, not in `rewards.py`, because `python -m algorithm.rewards`
runs that module as `__main__`: a user's callable must see the classes the CLI builds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any


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


# --- numbers in free text ------------------------------------------------------------

# A number token: optional minus, digits with optional thousands commas ("1,234"),
# optional decimal part. The minus only counts when it is not glued to a word or a
# digit ("5-3" is 5 then 3, "step-2" is 2), and digits glued to a word ("Qwen3") are
# not a number. A trailing period ("72.") is sentence punctuation, not a decimal point,
# because the decimal part needs at least one digit.
_NUMBER = re.compile(r"(?<![\w.])(?P<body>-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?)(?![0-9])")
_INTEGER_ONLY = re.compile(r"-?[0-9]+")
_UNICODE_MINUS = "\u2212"  # "−", which models emit from math-heavy pretraining


def _normalise_minus(text: str) -> str:
    return text.replace(_UNICODE_MINUS, "-")


def number_tokens(text: str) -> list[Fraction]:
    """Every number in reading order, exact (Fraction) so "72.0" equals "72".

    Exact arithmetic rather than float keeps comparisons free of rounding surprises
    on large gsm8k answers.
    """
    return [Fraction(m.group("body").replace(",", "")) for m in _NUMBER.finditer(_normalise_minus(text))]


def parse_integer(text: str | None) -> int | None:
    """The value of a text that is nothing but an integer (optional leading minus).

    Used for references and for `arithmetic_exact_match`'s completion; anything else
    (a "+", a decimal point, prose, None) is None, which callers treat as "no match".
    """
    if text is None:
        return None
    stripped = _normalise_minus(text).strip()
    if not _INTEGER_ONLY.fullmatch(stripped):
        return None
    return int(stripped)


def gsm8k_answer(text: str) -> Fraction | None:
    """The final answer as gsm8k writes it: the first number after the last `####`,
    else the last number in the text.

    A `####` with no number after it is an empty final answer (None) rather than a
    fall-back to earlier numbers: the model committed to that marker.
    """
    marker = text.rfind("####")
    if marker >= 0:
        after = number_tokens(text[marker + 4 :])
        return after[0] if after else None
    numbers = number_tokens(text)
    return numbers[-1] if numbers else None


# --- countdown: a safe parser for integer equations ------------------------------------

MAX_EXPRESSION_CHARS = 512  # longer "equations" are not answers; bounds parse time
MAX_PAREN_DEPTH = 32  # bounds recursion, whatever the model writes

_EQUATION_SPAN = re.compile(r"[0-9+\-*/()=×÷ \t]+")
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"</answer>", re.IGNORECASE)
_TOKEN = re.compile(r"\s*(?:(?P<int>[0-9]+)|(?P<op>[-+*/()]))")
_OPERATORS = set("+-*/")


class _NotAnEquation(Exception):
    """Internal: any parse or evaluation failure; never escapes this module."""


def _tokenize(expression: str) -> list[str]:
    expression = expression.replace("×", "*").replace("÷", "/")
    tokens: list[str] = []
    position = 0
    end = len(expression.rstrip())
    while position < end:
        match = _TOKEN.match(expression, position)
        if match is None:
            raise _NotAnEquation(f"unexpected character at {position}")
        tokens.append(match.group("int") or match.group("op"))
        position = match.end()
    if not tokens:
        raise _NotAnEquation("empty expression")
    return tokens


class _Parser:
    """Recursive descent over the grammar

        expr   := term (("+" | "-") term)*
        term   := unary (("*" | "/") unary)*
        unary  := "-" unary | atom
        atom   := INT | "(" expr ")"

    evaluating exactly with Fractions as it goes, so (1 + 2) / 3 is exactly 1 and a
    division by zero is a parse failure rather than a crash.
    """

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0
        self.depth = 0
        self.literals: list[int] = []

    def parse(self) -> Fraction:
        value = self._expr()
        if self.position != len(self.tokens):
            raise _NotAnEquation(f"unexpected {self.tokens[self.position]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise _NotAnEquation("expression ends early")
        self.position += 1
        return token

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            value = value + self._term() if self._take() == "+" else value - self._term()
        return value

    def _term(self) -> Fraction:
        value = self._unary()
        while self._peek() in ("*", "/"):
            operator = self._take()
            right = self._unary()
            if operator == "*":
                value = value * right
            elif right == 0:
                raise _NotAnEquation("division by zero")
            else:
                value = value / right
        return value

    def _unary(self) -> Fraction:
        if self._peek() == "-":
            self._take()
            self._enter()
            value = -self._unary()
            self.depth -= 1
            return value
        return self._atom()

    def _atom(self) -> Fraction:
        token = self._take()
        if token == "(":
            self._enter()
            value = self._expr()
            if self._take() != ")":
                raise _NotAnEquation("unbalanced parentheses")
            self.depth -= 1
            return value
        if token.isdigit():
            self.literals.append(int(token))
            return Fraction(int(token))
        raise _NotAnEquation(f"unexpected {token!r}")

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_PAREN_DEPTH:
            raise _NotAnEquation("nested too deeply")


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]] | None:
    """(value, integer literals used) of an integer arithmetic expression, or None.

    None covers every way model text can fail: unknown characters, unbalanced
    parentheses, division by zero, over-long or over-deep input.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        return None
    try:
        parser = _Parser(_tokenize(expression))
        return parser.parse(), parser.literals
    except _NotAnEquation:
        return None


def uses_numbers_at_most_once(literals: Iterable[int], numbers: Iterable[int]) -> bool:
    """True when every literal is one of `numbers`, none used more often than given.

    A multiset check: with numbers [3, 3, 5], "3 * 3" is allowed and "3 * 3 * 3" is not.
    Unused numbers are allowed (S-REW-1: "each at most once").
    """
    available = Counter(numbers)
    return not (Counter(literals) - available)


def _last_match(pattern: re.Pattern[str], text: str, end: int) -> re.Match[str] | None:
    last = None
    for last in pattern.finditer(text, 0, end):
        pass
    return last


def _equation_candidate(completion: str) -> str | None:
    """The one equation the rule judges, so a model cannot list many and win on any.

    Inside the last `<answer>…</answer>` block the whole block content must be the
    equation. Without a block, the last equation-looking run of characters that has
    a digit and an operator is taken ("So 3 * 4 = 12." judges "3 * 4 = 12").
    """
    # Last closing tag, then the last opening tag before it, each a linear scan: a
    # lazy `<answer>(.*?)</answer>` would rescan the tail for every unclosed tag,
    # quadratic on "<answer>" * 100_000.
    close = _last_match(_CLOSE_TAG, completion, len(completion))
    opening = _last_match(_OPEN_TAG, completion, close.start()) if close else None
    if close and opening:
        return completion[opening.end() : close.start()].strip()
    candidates = [
        span.strip()
        for span in _EQUATION_SPAN.findall(completion)
        if any(c.isdigit() for c in span) and any(c in _OPERATORS or c in "×÷" for c in span)
    ]
    return candidates[-1] if candidates else None


def countdown_correct(completion: str, numbers: Iterable[int], target: int) -> bool:
    """S-REW-1 countdown: an equation over `numbers` (each at most once) equal to `target`.

    Accepted forms: `expr`, `expr = target` and `target = expr`; a stated result
    must itself equal the target.
    """
    candidate = _equation_candidate(_normalise_minus(completion))
    if candidate is None or len(candidate) > MAX_EXPRESSION_CHARS:
        return False
    sides = [side.strip() for side in candidate.split("=")]
    if len(sides) == 1:
        expression = sides[0]
    elif len(sides) == 2 and parse_integer(sides[1]) == target:
        expression = sides[0]
    elif len(sides) == 2 and parse_integer(sides[0]) == target:
        expression = sides[1]
    else:
        return False
    evaluated = evaluate_expression(expression)
    if evaluated is None:
        return False
    value, literals = evaluated
    return value == target and uses_numbers_at_most_once(literals, numbers)


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
