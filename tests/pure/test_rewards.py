"""Reward rules, rule resolution, PPO's scale, process shaping and the CLI (S-REW-1..5)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from algorithm.rewards import (
    RULE_NAMES,
    RewardConfigError,
    RewardContext,
    TerminalMatcher,
    process_reward,
    resolve_terminal,
    terminal_reward,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- callables the terminal_callable tests point at (tests.pure.test_rewards:NAME) ----


def half_credit(ctx: RewardContext) -> float:
    return 0.5


def length_equals_reference(ctx: RewardContext) -> bool:
    return len(ctx.completion) == int(ctx.reference)


def says_hello(ctx: RewardContext) -> bool:
    return "hello" in ctx.completion


says_hello.needs_reference = False  # type: ignore[attr-defined]


def out_of_range(ctx: RewardContext) -> float:
    return 1.5


def bad_needs_reference(ctx: RewardContext) -> bool:
    return True


bad_needs_reference.needs_reference = "no"  # type: ignore[attr-defined]


class Scorers:
    @staticmethod
    def always(ctx: RewardContext) -> bool:
        return True


NOT_CALLABLE = 3


def score(rule: str, completion: str, reference: str | None = None, **metadata) -> bool:
    matcher = resolve_terminal(rule)
    assert matcher is not None
    return bool(matcher.match(RewardContext(prompt="p", completion=completion, reference=reference, metadata=metadata)))


# --- S-REW-1: the rules ---------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        ("12", "12", True),
        (" 12\n", "12", True),  # surrounding whitespace is stripped
        ("-7", "-7", True),  # negative numbers
        ("\u22127", "-7", True),  # a unicode minus is still a minus
        ("007", "7", True),  # compared as integers
        ("12", "13", False),
        ("-12", "12", False),
        ("+12", "12", False),  # only a leading minus is allowed
        ("12.", "12", False),  # nothing but the integer
        ("12.0", "12", False),
        ("The answer is 12", "12", False),  # prose is not allowed by PPO's own matcher
        ("12 13", "12", False),
        ("", "12", False),
        ("12", "twelve", False),  # a non-integer reference never matches
    ],
)
def test_arithmetic_exact_match(completion, reference, expected):
    assert score("arithmetic_exact_match", completion, reference) is expected


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        ("The answer is 12, not 13", "12", True),
        ("The answer is 12, not 13", "13", False),  # only the first number counts
        ("x = -5 and then 3", "-5", True),  # negative numbers count
        ("5-3 is what I computed", "5", True),  # a minus after a digit is subtraction
        ("5-3 is what I computed", "-3", False),
        ("step-2: 7", "2", True),  # a hyphen glued to a word is not a minus
        ("1,234 apples", "1234", True),  # thousands commas belong to the number
        ("2.5 then 2", "2", False),  # the first number is 2.5, not the integer 2
        ("Qwen3 says 4", "4", True),  # digits inside a word are not a number
        ("no digits here", "1", False),
        ("42", "42", True),
    ],
)
def test_arithmetic_first_integer(completion, reference, expected):
    assert score("arithmetic", completion, reference) is expected


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        ("She sold 48 clips, so #### 72", "72", True),
        ("#### 5\nwait, correction\n#### 72", "72", True),  # the last #### wins
        ("#### 72\n#### 5", "72", False),
        ("The total is 1,234.", "1234", True),  # commas and a trailing period
        ("#### 1,234.", "1,234", True),
        ("#### $1,234.00", "1234", True),  # compared numerically
        ("#### -3", "-3", True),
        ("first 5, then 72 is final", "72", True),  # no ####: the last number
        ("first 72, then 5 is final", "72", False),
        ("So the answer is 72.", "Natalia sold 48/2 = 24 clips.\n48+24 = 72\n#### 72", True),  # gsm8k-style reference
        ("#### 72", "72.0", True),
        ("#### 72.5", "72", False),
        ("#### ", "72", False),  # an empty final answer is not the earlier numbers
        ("no numbers", "72", False),
    ],
)
def test_gsm8k(completion, reference, expected):
    assert score("gsm8k", completion, reference) is expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("3*5+7", True),  # 15 + 7 = 22
        ("3 * 5 + 7 = 22", True),  # expr = target
        ("22 = 7 + 3 * 5", True),  # target = expr
        ("<answer>(3*5)+7</answer>", True),
        ("<answer> 3 * 5 + 7 = 22 </answer>", True),
        ("Let me think. 3 + 5 = 8, no. So 3 * 5 + 7 = 22.", True),  # the last equation in prose
        ("3 × 5 + 7", True),  # typographic multiplication sign
        ("3*5+7 = 23", False),  # the stated result must be the target
        ("3*5+7 = 22 = 22", False),
        ("3*5+7\n3+5", False),  # the last equation is judged, not any of them
        ("3+5 3*5+7 5+7", False),  # a run of several expressions is not one equation
        ("<answer>3+5</answer> <answer>3*5+7</answer>", True),  # the last answer block wins
        ("<answer>3*5+7</answer> <answer>3+5</answer>", False),
        ("<answer>3*5+7, I think</answer>", False),  # the block must be the equation only
        ("7*3+1", False),  # 1 is not one of the numbers
        ("7+7+5+3", False),  # 7 is used twice
        ("3*5+7/0", False),  # division by zero
        ("(3*5+7", False),  # unbalanced parentheses
        ("3*5+7)", False),
        ("<answer>3*5+7)</answer>", False),
        ("<answer>3*5 % 7</answer>", False),  # unknown character
        ("<answer>3 ** 5</answer>", False),  # ** is not an operator here
        ("<answer>((((3*5))))+7</answer>", True),  # nesting within the cap
        ("<answer>" + "(" * 40 + "3*5+7" + ")" * 40 + "</answer>", False),  # deeper than MAX_PAREN_DEPTH
        ("I cannot solve this.", False),
        ("", False),
    ],
)
def test_countdown(completion, expected):
    assert score("countdown", completion, "22", numbers=[3, 5, 7]) is expected


@pytest.mark.parametrize(
    "completion, numbers, target, expected",
    [
        ("3*3+5", [3, 3, 5], "14", True),  # a repeated number may be used as often as given
        ("3*3*3+5", [3, 3, 5], "32", False),
        ("(1+2)/3", [1, 2, 3], "1", True),  # exact rational arithmetic: 3/3 = 1
        ("7/2*2", [7, 2, 2], "7", True),  # not 6 (no integer division), not 6.999 (no floats)
        ("7/2", [7, 2], "3", False),
        ("-3+25", [3, 25], "22", True),  # unary minus
        ("3*5+7", "3, 5, 7", "22", True),  # numbers given as a string in the row
        ("3*5+7", [3, 5, 7], "not a number", False),
    ],
)
def test_countdown_numbers_and_arithmetic(completion, numbers, target, expected):
    assert score("countdown", completion, target, numbers=numbers) is expected


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>__import__('os').system('touch {marker}')</answer>",
        "__import__('os').system('touch {marker}')",
        "<answer>().__class__.__bases__[0].__subclasses__()</answer>",
        "<answer>open('{marker}', 'w')</answer>",
        "<answer>eval('3*5+7')</answer>",
    ],
)
def test_countdown_never_executes_model_text(completion, tmp_path):
    marker = tmp_path / "pwned"
    assert score("countdown", completion.format(marker=marker), "22", numbers=[3, 5, 7]) is False
    assert not marker.exists()


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("1+" * 100_000 + "1", False),  # one 200 kB "equation": over MAX_EXPRESSION_CHARS
        ("(" * 100_000 + "3*5+7" + ")" * 100_000, False),
        ("<answer>" + "(" * 100_000 + "</answer>", False),
        ("<answer>" * 100_000 + "3*5+7", True),  # unclosed tags: no block, the equation in the text counts
        ("<answer>3*5+7</answer>" * 20_000, True),
        ("3*5+7 " + "x" * 1_000_000, True),  # long prose after the equation is fine
    ],
)
def test_countdown_very_long_input_is_bounded(completion, expected):
    started = time.perf_counter()
    assert score("countdown", completion, "22", numbers=[3, 5, 7]) is expected
    assert time.perf_counter() - started < 2.0


def test_countdown_without_numbers_names_the_key():
    with pytest.raises(ValueError, match=r'metadata\["numbers"\]'):
        score("countdown", "3*5+7", "22")


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        ("  Paris\n", "Paris", True),
        ("Paris", " Paris ", True),
        ("paris", "Paris", False),
        ("Paris.", "Paris", False),
    ],
)
def test_exact_match(completion, reference, expected):
    assert score("exact_match", completion, reference) is expected


@pytest.mark.parametrize("completion, expected", [("x", True), ("  \n\t", False), ("", False)])
def test_nonempty(completion, expected):
    assert score("nonempty", completion) is expected


@pytest.mark.parametrize("completion", ["", "anything", "12"])
def test_constant(completion):
    assert score("constant", completion) is True


# --- S-REW-2: needs ---------------------------------------------------------------


def test_the_reward_rules_page_is_generated_from_the_registry():
    from algorithm.reward_rules import render
    from tests.conftest import REPO_ROOT

    committed = (REPO_ROOT / "docs" / "reference" / "reward-rules.md").read_text()
    assert committed == render(), "run: python -m algorithm.reward_rules > docs/reference/reward-rules.md"


def test_a_rule_is_one_registry_entry_and_a_name_is_registered_once(monkeypatch):
    from algorithm import reward_rules

    monkeypatch.setattr(reward_rules, "RULES", dict(reward_rules.RULES))

    @reward_rules.reward_rule("yes_or_no", correct_when="the completion is `yes`", needs_reference=False)
    def says_yes(ctx: RewardContext) -> bool:
        return ctx.completion.strip() == "yes"

    entry = reward_rules.RULES["yes_or_no"]
    assert not entry.ppo_own and entry.matcher().match(RewardContext(prompt="p", completion=" yes ")) is True
    with pytest.raises(ValueError, match="'gsm8k' is registered twice"):
        reward_rules.reward_rule("gsm8k", correct_when="twice")(says_yes)


def test_rule_names_are_the_spec_list():
    assert set(RULE_NAMES) == {
        "arithmetic_exact_match", "none", "arithmetic", "gsm8k", "countdown", "exact_match", "nonempty", "constant",
    }


@pytest.mark.parametrize(
    "rule, needs_reference",
    [
        ("arithmetic_exact_match", True),
        ("arithmetic", True),
        ("gsm8k", True),
        ("countdown", True),
        ("exact_match", True),
        ("nonempty", False),
        ("constant", False),
    ],
)
def test_rules_declare_their_needs(rule, needs_reference):
    matcher = resolve_terminal(rule)
    assert matcher.name == rule
    assert matcher.needs_reference is needs_reference


def test_missing_reference_is_loud_not_a_zero_reward():
    ctx = RewardContext(prompt="p", completion="12")
    with pytest.raises(ValueError, match="needs a reference"):
        terminal_reward(resolve_terminal("arithmetic_exact_match"), ctx)


# --- S-REW-4: resolve_terminal ------------------------------------------------------


def test_none_resolves_to_no_matcher():
    assert resolve_terminal("none") is None


def test_unknown_rule_lists_the_accepted_names():
    with pytest.raises(RewardConfigError) as raised:
        resolve_terminal("gsm8K")
    message = str(raised.value)
    assert "rl.reward.terminal" in message and "'gsm8K'" in message
    for name in RULE_NAMES:
        assert name in message


@pytest.mark.parametrize("rule", ["arithmetic", "gsm8k", "countdown", "exact_match", "nonempty", "constant"])
def test_callable_with_a_shared_rule_names_both_keys(rule):
    with pytest.raises(RewardConfigError) as raised:
        resolve_terminal(rule, "tests.pure.test_rewards:half_credit")
    message = str(raised.value)
    assert "rl.reward.terminal=" in message and "rl.reward.terminal_callable=" in message
    assert rule in message


@pytest.mark.parametrize("ppo_rule", ["arithmetic_exact_match", "none"])
def test_callable_overrides_ppo_own_matcher(ppo_rule):
    matcher = resolve_terminal(ppo_rule, "tests.pure.test_rewards:length_equals_reference")
    assert matcher.name == "tests.pure.test_rewards:length_equals_reference"
    assert matcher.match is length_equals_reference
    assert matcher.needs_reference is True  # the default for a callable
    assert terminal_reward(matcher, RewardContext(prompt="p", completion="four", reference="4")) == 1.0
    assert terminal_reward(matcher, RewardContext(prompt="p", completion="five", reference="5")) == 0.0


def test_callable_can_declare_it_needs_no_reference():
    matcher = resolve_terminal("arithmetic_exact_match", "tests.pure.test_rewards:says_hello")
    assert matcher.needs_reference is False
    assert terminal_reward(matcher, RewardContext(prompt="p", completion="hello there")) == 1.0


def test_callable_may_be_a_dotted_attribute():
    matcher = resolve_terminal("arithmetic_exact_match", "tests.pure.test_rewards:Scorers.always")
    assert matcher.match(RewardContext(prompt="p", completion="", reference="x")) is True


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("tests.pure.test_rewards.half_credit", "not a 'package.module:callable' path"),  # no colon
        (":half_credit", "not a 'package.module:callable' path"),
        ("tests.pure.test_rewards:", "not a 'package.module:callable' path"),
        ("no_such_package.rewards:fn", "no module named 'no_such_package' (looked in"),
        ("tests.pure.test_rewards:no_such_fn", "has no attribute 'no_such_fn'"),
        ("tests.pure.test_rewards:NOT_CALLABLE", "not a callable"),
        ("tests.pure.test_rewards:bad_needs_reference", "needs_reference must be True or False"),
    ],
)
def test_bad_callable_path_names_the_path(path, fragment):
    with pytest.raises(RewardConfigError) as raised:
        resolve_terminal("arithmetic_exact_match", path)
    message = str(raised.value)
    assert "rl.reward.terminal_callable" in message and repr(path) in message
    assert fragment in message


# --- S-REW-3: PPO's scale -----------------------------------------------------------


def _fixed(result) -> TerminalMatcher:
    return TerminalMatcher(name="fixed", needs_reference=False, match=lambda ctx: result)


CTX = RewardContext(prompt="p", completion="c")


@pytest.mark.parametrize(
    "result, expected",
    [
        (True, 2.0),  # correct_reward
        (False, -1.0),  # incorrect_reward
        (1.0, 2.0),
        (0.0, -1.0),
        (0.5, 0.5),  # -1 + 0.5 * (2 - (-1)) = 0.5
        (1, 2.0),  # ints are scores too
    ],
)
def test_terminal_reward_on_ppo_scale(result, expected):
    assert terminal_reward(_fixed(result), CTX, correct_reward=2.0, incorrect_reward=-1.0) == pytest.approx(expected)


def test_terminal_reward_defaults_are_one_and_zero():
    assert terminal_reward(_fixed(True), CTX) == 1.0
    assert terminal_reward(_fixed(False), CTX) == 0.0


def test_no_matcher_contributes_nothing_even_with_a_nonzero_incorrect_reward():
    assert terminal_reward(None, CTX, correct_reward=1.0, incorrect_reward=-1.0) == 0.0


@pytest.mark.parametrize("result", [1.5, -0.1, float("nan"), None, "1.0"])
def test_out_of_range_scores_are_refused(result):
    with pytest.raises(ValueError, match="expected a bool or a float score in \\[0, 1\\]"):
        terminal_reward(_fixed(result), CTX)


def test_rule_scores_through_terminal_reward():
    ctx = RewardContext(prompt="p", completion="#### 1,234.", reference="1234")
    assert terminal_reward(resolve_terminal("gsm8k"), ctx, correct_reward=3.0, incorrect_reward=-0.5) == 3.0
    ctx = RewardContext(prompt="p", completion="#### 1,235.", reference="1234")
    assert terminal_reward(resolve_terminal("gsm8k"), ctx, correct_reward=3.0, incorrect_reward=-0.5) == -0.5


# --- S-REW-5: process shaping ------------------------------------------------------


def test_process_none_is_zeros_of_the_mask_shape():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = process_reward("none", mask)
    assert out.shape == (2, 3)
    assert torch.equal(out, torch.zeros(2, 3))


def test_process_linear_ramp():
    # L = 3: weights 2·k / (3·4) = [1/6, 2/6, 3/6]; coef 0.06 -> [0.01, 0.02, 0.03]
    # L = 4: weights 2·k / (4·5) = [0.1, 0.2, 0.3, 0.4]; coef 1.0 -> the same
    # L = 1: the single token gets the whole coef
    # L = 0: nothing
    mask = torch.tensor(
        [
            [1.0, 1.0, 1.0, 0.0],
            [1.0, 1.0, 1.0, 1.0],
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    out = process_reward("linear", mask, coef=0.06)
    torch.testing.assert_close(out[0], torch.tensor([0.01, 0.02, 0.03, 0.0]))
    torch.testing.assert_close(process_reward("linear", mask, coef=1.0)[1], torch.tensor([0.1, 0.2, 0.3, 0.4]))
    torch.testing.assert_close(out[2], torch.tensor([0.06, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(out[3], torch.zeros(4))


def test_process_linear_sums_to_coef_whatever_the_length():
    lengths = torch.tensor([1, 2, 7, 50, 128])
    mask = (torch.arange(128)[None, :] < lengths[:, None]).float()  # (5, 128)
    out = process_reward("linear", mask, coef=0.25)
    torch.testing.assert_close(out.sum(dim=1), torch.full((5,), 0.25))
    assert torch.all(out[mask == 0] == 0)


def test_process_linear_default_coef_sums_to_a_tenth():
    out = process_reward("linear", torch.ones(2, 5))
    torch.testing.assert_close(out.sum(dim=1), torch.full((2,), 0.1))


def test_process_linear_counts_only_real_tokens_across_gaps():
    # real tokens at positions 0, 2, 3 -> k = 1, 2, 3; L = 3; coef 0.06 -> [0.01, 0, 0.02, 0.03]
    mask = torch.tensor([[True, False, True, True]])
    out = process_reward("linear", mask, coef=0.06)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[0.01, 0.0, 0.02, 0.03]]))


def test_process_keeps_a_floating_mask_dtype():
    assert process_reward("linear", torch.ones(1, 3, dtype=torch.float64)).dtype == torch.float64


def test_process_unknown_kind_names_the_key():
    with pytest.raises(RewardConfigError, match=r"rl\.reward\.process='quadratic'.*linear"):
        process_reward("quadratic", torch.ones(1, 3))


def test_process_refuses_a_mask_that_is_not_2d():
    with pytest.raises(ValueError, match=r"\(b, r\)"):
        process_reward("linear", torch.ones(3))


# --- the CLI ------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "algorithm.rewards", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_a_correct_reward():
    result = run_cli("gsm8k", "--reference", "#### 1234", "The total is 1,234.")
    assert result.returncode == 0, result.stderr
    assert "matched: yes" in result.stdout
    assert "reward: 1.0" in result.stdout


def test_cli_prints_an_incorrect_reward_on_a_custom_scale():
    result = run_cli(
        "arithmetic_exact_match", "--reference", "-5", "--correct-reward", "2", "--incorrect-reward", "-1", "-4"
    )
    assert result.returncode == 0, result.stderr
    assert "matched: no" in result.stdout
    assert "reward: -1.0" in result.stdout


def test_cli_countdown_takes_target_and_numbers():
    result = run_cli("countdown", "--numbers", "3,5,7", "--target", "22", "<answer>3*5+7</answer>")
    assert result.returncode == 0, result.stderr
    assert "reward: 1.0" in result.stdout


def test_cli_callable_path_with_a_partial_score():
    result = run_cli("tests.pure.test_rewards:half_credit", "--reference", "x", "--correct-reward", "4", "anything")
    assert result.returncode == 0, result.stderr
    assert "score 0.5" in result.stdout
    assert "reward: 2.0" in result.stdout  # 0 + 0.5 * (4 - 0)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("gsm9k", "72"), "unknown rule 'gsm9k'"),
        (("gsm8k", "72"), "pass --reference"),
        (("countdown", "--numbers", "3,5,7", "3*5+7"), "pass --target"),
        (("countdown", "--target", "22", "3*5+7"), "pass --numbers"),
        (("countdown", "--numbers", "3,x", "--target", "22", "3*5+7"), "--numbers must be comma-separated integers"),
        (("no_such_package.mod:fn", "--reference", "1", "1"), "no module named 'no_such_package'"),
    ],
)
def test_cli_usage_errors_exit_2(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert result.stdout == ""
