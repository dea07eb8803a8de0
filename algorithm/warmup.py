"""The one predicate that decides whether an outer iteration is critic-only.

Everything that behaves differently during critic warmup (the policy-train task,
weight_sync, the metrics) asks this function, so the N / N+1 / N−1 off-by-one
mistakes of other frameworks have one place to hide and one test to catch them.
"""


def is_critic_warmup(outer_iteration: int, critic_warmup_iterations: int) -> bool:
    """Outer iterations are 1-based; iterations 1..N are warmup (S-CW-1), N+1 is the
    first actor update (S-CW-2)."""
    if outer_iteration < 1:
        raise ValueError(f"outer iterations start at 1 (got {outer_iteration})")
    return outer_iteration <= critic_warmup_iterations


def expected_policy_version(outer_iteration: int, critic_warmup_iterations: int) -> int:
    """Published actor updates after `outer_iteration` completed iterations: one per
    non-warmup iteration (S-CW-4, the cross-check of S-CW-9)."""
    return max(0, outer_iteration - critic_warmup_iterations)
