"""PPO's rewards: resolving `rl.reward.terminal`, scoring on PPO's scale, process shaping.

The rules themselves live in `algorithm.reward_rules`. torch is imported inside
`process_reward` only: config validation and the try-it CLI score strings
(`python -m algorithm.rewards gsm8k --reference 72 "... #### 72"`) and skip its import.

Notation for tensor shapes: b = sequences in the batch, r = response length (padded).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from algorithm.reward_rules import (
    PPO_RULE_NAMES,
    RULE_NAMES,
    RULES,
    SHARED_RULE_NAMES,
    RewardContext,
    TerminalMatcher,
)
from configs.callables import import_callable
from contracts.faults import RepeatsOnRerun

if TYPE_CHECKING:
    import torch

__all__ = [
    "PPO_RULE_NAMES",
    "PROCESS_KINDS",
    "RULE_NAMES",
    "SHARED_RULE_NAMES",
    "DEFAULT_PROCESS_COEF",
    "RewardConfigError",
    "RewardContext",
    "TerminalMatcher",
    "process_reward",
    "resolve_terminal",
    "on_ppo_scale",
    "terminal_reward",
    "terminal_score",
]

PROCESS_KINDS: tuple[str, ...] = ("none", "linear")  # S-REW-5
DEFAULT_PROCESS_COEF = 0.1  # the whole linear term is worth a tenth of the default correct/incorrect gap


class RewardConfigError(ValueError, RepeatsOnRerun):
    """A reward setting that cannot be resolved; the message names the config keys."""


# --- terminal rule resolution -------------------------------------------------------


def _callable_matcher(path: str, trusted: Iterable[str]) -> TerminalMatcher:
    fn = import_callable(path, key="rl.reward.terminal_callable", error=RewardConfigError, trusted=trusted)
    # S-REW-2: a callable needs the reference unless it says otherwise, because
    # guessing "no" would hand it None where it expected the ground truth.
    needs_reference = getattr(fn, "needs_reference", True)
    if not isinstance(needs_reference, bool):
        raise RewardConfigError(
            f"rl.reward.terminal_callable={path!r}: attribute needs_reference must be True or False, "
            f"got {needs_reference!r}"
        )
    return TerminalMatcher(name=path, needs_reference=needs_reference, match=fn)


def resolve_terminal(
    terminal: str, terminal_callable: str | None = None, trusted: Iterable[str] = ()
) -> TerminalMatcher | None:
    """The matcher for `rl.reward.terminal` / `rl.reward.terminal_callable`, or None.

    None means no terminal reward. A callable overrides PPO's own matchers but is
    refused beside a shared rule (S-REW-4): the run would otherwise silently score with
    only one of the two the user asked for. Raises RewardConfigError naming the key.
    """
    if terminal not in RULE_NAMES:
        raise RewardConfigError(
            f"rl.reward.terminal={terminal!r} is not a reward rule; accepted: {', '.join(RULE_NAMES)} "
            "(or keep a PPO rule and set rl.reward.terminal_callable='package.module:callable')"
        )
    if terminal_callable is not None:
        if terminal in SHARED_RULE_NAMES:
            raise RewardConfigError(
                f"rl.reward.terminal={terminal!r} is a shared rule and cannot be combined with "
                f"rl.reward.terminal_callable={terminal_callable!r}; unset one of them, or set "
                f"rl.reward.terminal to one of {', '.join(PPO_RULE_NAMES)} to let the callable override it"
            )
        return _callable_matcher(terminal_callable, trusted)
    return RULES[terminal].matcher()


# --- PPO's scale --------------------------------------------------------------------


def _match_score(name: str, result: Any) -> float:
    """A match result as a score in [0, 1]; a callable's bug is loud, not clipped."""
    if isinstance(result, bool):
        return 1.0 if result else 0.0
    if isinstance(result, (str, bytes)) or result is None:
        score = math.nan
    else:
        try:
            score = float(result)  # also takes numpy / 0-d tensor scalars
        except (TypeError, ValueError):
            score = math.nan
    if not 0.0 <= score <= 1.0:  # NaN fails this too
        raise ValueError(
            f"terminal matcher {name!r} returned {result!r}; expected a bool or a float score in [0, 1]"
        )
    return score


def terminal_score(matcher: TerminalMatcher | None, ctx: RewardContext) -> float | None:
    """The match as a score in [0, 1] (True is 1.0), or None without a matcher.

    Kept apart from the scale so callers that report "matched?" (the CLI, metrics)
    call a user's callable once.
    """
    if matcher is None:
        return None
    if matcher.needs_reference and ctx.reference is None:
        raise ValueError(
            f"terminal matcher {matcher.name!r} needs a reference but RewardContext.reference "
            "is None; set rl.data.reference_key to the row key holding the ground truth"
        )
    return _match_score(matcher.name, matcher.match(ctx))


def on_ppo_scale(score: float | None, *, correct_reward: float = 1.0, incorrect_reward: float = 0.0) -> float:
    """S-REW-3: a score s in [0, 1] becomes incorrect + s·(correct − incorrect); None is 0.0."""
    if score is None:
        return 0.0
    return incorrect_reward + score * (correct_reward - incorrect_reward)


def terminal_reward(
    matcher: TerminalMatcher | None,
    ctx: RewardContext,
    *,
    correct_reward: float = 1.0,
    incorrect_reward: float = 0.0,
) -> float:
    """The sequence's terminal reward on PPO's scale (S-REW-3).

    A partial score s from a terminal_callable lands at incorrect + s·(correct − incorrect),
    so rewards stay on one scale whatever the rule. No matcher contributes 0.0, not
    `incorrect_reward`: there is no terminal term at all. ValueError for a missing
    reference or a callable's answer outside a bool or [0, 1].
    """
    score = terminal_score(matcher, ctx)
    return on_ppo_scale(score, correct_reward=correct_reward, incorrect_reward=incorrect_reward)


# --- process shaping ----------------------------------------------------------------


def process_reward(kind: str, response_mask: torch.Tensor, *, coef: float = DEFAULT_PROCESS_COEF) -> torch.Tensor:
    """S-REW-5: the per-token shaping term, added beside the terminal reward.

    "linear": process[i, t] = coef · 2·k_t / (L_i·(L_i + 1)) on the k-th of sequence i's
    L_i response tokens, 0 on padding; it sums to `coef` whatever the length, so it
    cannot be farmed by rambling, and ramps toward the end, where the terminal reward
    lands (docs/rewards.md). Example: L = 3, coef = 0.06 -> [0.01, 0.02, 0.03].

    response_mask: (b, r), nonzero on response tokens (gaps allowed). `coef` may be
    negative (a penalty). Returns (b, r), the mask's dtype if floating, else float32.
    """
    import torch  # see the module docstring: the string-only paths skip torch

    if kind not in PROCESS_KINDS:
        raise RewardConfigError(f"rl.reward.process={kind!r} is not accepted; use one of {', '.join(PROCESS_KINDS)}")
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must have shape (b, r), got {tuple(response_mask.shape)}")
    dtype = response_mask.dtype if response_mask.is_floating_point() else torch.float32
    mask = (response_mask != 0).to(dtype)  # (b, r)
    if kind == "none":
        return torch.zeros_like(mask)
    position = torch.cumsum(mask, dim=1) * mask  # (b, r): k_t on real tokens, 0 on padding
    length = mask.sum(dim=1, keepdim=True)  # (b, 1): L_i
    triangular = (length * (length + 1) / 2).clamp(min=1.0)  # (b, 1); clamp only guards L_i = 0
    return coef * position / triangular


# --- the try-it CLI -----------------------------------------------------------------


class _UsageError(Exception):
    """A CLI input problem: printed as a usage error, exit status 2."""


def _parse_numbers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as error:
        raise _UsageError(f"--numbers must be comma-separated integers like 3,5,7, got {text!r}") from error


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m algorithm.rewards",
        description="Score one completion with a terminal reward rule, on PPO's scale (S-REW).",
        epilog="examples:\n"
        '  python -m algorithm.rewards arithmetic_exact_match --reference 12 "12"\n'
        '  python -m algorithm.rewards gsm8k --reference "#### 1234" "The total is 1,234."\n'
        '  python -m algorithm.rewards countdown --numbers 3,5,7 --target 22 "<answer>3*5+7</answer>"\n'
        '  python -m algorithm.rewards my_pkg.rewards:score --reference 4 "four"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("rule", help=f"one of {', '.join(RULE_NAMES)}, or a package.module:callable path")
    parser.add_argument("completion", help="the generated text to score ('-' reads it from stdin)")
    parser.add_argument("--reference", help="the ground truth, for rules that need one")
    parser.add_argument("--prompt", default="", help="the prompt, passed to the rule untouched")
    parser.add_argument("--numbers", help="countdown: the usable integers, e.g. 3,5,7")
    parser.add_argument("--target", help="countdown: the target (same as --reference)")
    parser.add_argument("--correct-reward", type=float, default=1.0, help="reward for a correct completion")
    parser.add_argument("--incorrect-reward", type=float, default=0.0, help="reward for an incorrect one")
    return parser


def _resolve_cli_rule(rule: str) -> TerminalMatcher | None:
    # A path in RULE's place means "PPO's matcher, overridden by this callable" (S-REW-4).
    if ":" in rule:
        return resolve_terminal("arithmetic_exact_match", terminal_callable=rule)
    if rule not in RULE_NAMES:
        raise _UsageError(
            f"unknown rule {rule!r}; accepted: {', '.join(RULE_NAMES)}, or a package.module:callable path"
        )
    return resolve_terminal(rule)


def _cli_context(args: argparse.Namespace, matcher: TerminalMatcher | None) -> RewardContext:
    reference = args.reference
    if args.target is not None:
        if reference is not None and reference.strip() != args.target.strip():
            raise _UsageError(f"--target {args.target!r} and --reference {reference!r} disagree; give one")
        reference = args.target
    metadata: dict[str, Any] = {}
    if args.numbers is not None:
        metadata["numbers"] = _parse_numbers(args.numbers)
    if matcher is not None and matcher.needs_reference and reference is None:
        flag = "--target" if matcher.name == "countdown" else "--reference"
        raise _UsageError(f"rule {matcher.name!r} needs a reference: pass {flag}")
    if matcher is not None and matcher.name == "countdown" and "numbers" not in metadata:
        raise _UsageError("rule 'countdown' needs the usable numbers: pass --numbers 3,5,7")
    completion = sys.stdin.read() if args.completion == "-" else args.completion
    return RewardContext(prompt=args.prompt, completion=completion, reference=reference, metadata=metadata)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the reward of one completion; exit 0, or 2 on a usage problem."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        matcher = _resolve_cli_rule(args.rule)
        ctx = _cli_context(args, matcher)
    except (RewardConfigError, _UsageError) as error:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    score = terminal_score(matcher, ctx)
    reward = on_ppo_scale(score, correct_reward=args.correct_reward, incorrect_reward=args.incorrect_reward)
    if score is None:
        matched = "n/a (no terminal reward)"
    elif score in (0.0, 1.0):
        matched = "yes" if score == 1.0 else "no"
    else:
        matched = f"partly (score {score})"
    print(f"rule: {args.rule}")
    print(f"matched: {matched}")
    print(f"reward: {reward}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
