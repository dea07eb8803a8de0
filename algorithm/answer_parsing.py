"""Reading an answer out of free model text: numbers (with thousands commas, a unicode
minus, sentence punctuation), a GSM8K final answer, and countdown equations through a
small recursive-descent parser that never evaluates model text as code. Pure string
functions; the rules that use them are algorithm/reward_rules.py."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction


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
