"""CPU profile: RLHF against a learned reward model, on a laptop with no download.

A tiny reward model (a one-label Qwen3 sequence classifier) is built and trained
locally on preference pairs of the copy-digit task (the prompt's digit is preferred
over any other answer), cached in its folder like the tiny policy. PPO then trains the
policy on the reward model's scores alone (`rl.reward.model.combine=model`): the copy
rule, `rl.reward.terminal`, is only measured, as `reward/fraction_correct` beside
`reward/model_raw_mean` in each row and in the run's curve, so a policy that pleases
the model without copying (reward hacking) shows as the two lines parting. Held-out
success is `val/exact_match`, the rule on each digit, greedy (docs/rewards.md).
"""

from configs.ppo_tiny_cpu import CONFIG as BASE
from configs.schema import RewardConfig, RewardModelConfig, TinyRewardModelSpec

CONFIG = BASE.model_copy(update={
    "job": BASE.job.model_copy(update={"name": "tiny-rlhf-cpu"}),
    "rl": BASE.rl.model_copy(update={
        "reward": RewardConfig(
            terminal="exact_match",  # measured only: its verdict never reaches the reward
            model=RewardModelConfig(
                # The folder name carries the training recipe: the folder is the cache.
                path="outputs/_models/tiny-reward-copy-digit-s500",
                tiny=TinyRewardModelSpec(task="copy_digit", train_steps=500, train_lr=3e-3),
                max_length=64,
                normalize=True,
                clip=5.0,
            ),
        ),
    }),
})
