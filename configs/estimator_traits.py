"""What each advantage estimator of `rl.advantage_estimator` needs of a run (S-OPT-2):
a critic, several samples per prompt, whitened advantages. The config's validators, the
placement plan and the pre-flight read these traits; the formulas are in
algorithm/advantage_estimators.py, one per name here, and that module refuses to import
when the two lists differ. The traits sit in configs/ because configs/ is below
algorithm/ (docs/architecture.md, "Import direction"): the config checks a name and the
keys it contradicts without reaching up for the formulas.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimatorTraits:
    name: str
    uses_critic: bool  # False: the run starts, trains and commits no critic
    uses_groups: bool  # True: needs several samples per prompt (rl.rollout.samples_per_prompt > 1)
    whitens: bool  # what rl.whiten_advantages=null means for it
    source: str


ESTIMATOR_TRAITS: dict[str, EstimatorTraits] = {
    entry.name: entry
    for entry in (
        EstimatorTraits("gae", uses_critic=True, uses_groups=False, whitens=True, source="Schulman et al. 2016"),
        EstimatorTraits("grpo", uses_critic=False, uses_groups=True, whitens=False,
                        source="Shao et al. 2024 (DeepSeekMath)"),
        EstimatorTraits("rloo", uses_critic=False, uses_groups=True, whitens=False, source="Ahmadian et al. 2024"),
        EstimatorTraits("reinforce_plus_plus", uses_critic=False, uses_groups=False, whitens=True,
                        source="Hu 2025"),
    )
}


def estimator_traits(name: str) -> EstimatorTraits:
    """The entry `name`; an unknown name is refused listing the known ones."""
    try:
        return ESTIMATOR_TRAITS[name]
    except KeyError:
        raise ValueError(
            f"rl.advantage_estimator: unknown estimator {name!r}; known: {', '.join(ESTIMATOR_TRAITS)}"
        ) from None


def uses_critic(name: str) -> bool:
    """Whether a run with this estimator has a critic role at all (S-OPT-2)."""
    return estimator_traits(name).uses_critic
