"""CPU profile where generating takes at least as long as training.

Prompt "reverse 8472019355", answer "5539102748": 8 to 20 digits, so every rollout
writes up to 21 tokens one at a time, while each trainer sees the 12 samples once (one
epoch, one minibatch). On a 2-core machine the rollout stage then takes at least as
long as the train stage, so running the next rollout beside this iteration's training
(`rl.rollout.max_staleness=1`, S-ASYNC) has something to hide, as on GPUs.

The tiny model (width 128) is born knowing how to reverse but with a base model's
habit: its short supervised pass (`model.tiny.pretrain_task="reverse"`, cached in the
model folder) ended 60 % of the answers with a period, which the shared `exact_match`
reward counts as wrong. PPO removes the habit and keeps the digits: held-out exact
match (`val/exact_match`, strings never trained on) rises within the default run
(docs/performance.md, "Reversal", has the figures and the stage times).
"""

from configs.schema import (
    DataConfig,
    JobConfig,
    ModelConfig,
    OptimizerConfig,
    PPOConfig,
    RewardConfig,
    RLConfig,
    RolloutConfig,
    TinyModelSpec,
    ValidationConfig,
)

DIGITS = {"min_digits": 8, "max_digits": 20}

CONFIG = PPOConfig(
    job=JobConfig(name="tiny-reverse-cpu", output_root="outputs", seed=0),
    model=ModelConfig(
        # The folder name carries the pre-training recipe: the folder is the cache.
        path="outputs/_models/tiny-qwen3-reverse8to20-h128-p150-dot60",
        tiny=TinyModelSpec(
            task_alphabet="0123456789reverse .",
            hidden_size=128,  # width 64 learns to reverse only for some seeds; 128 within these steps
            intermediate_size=256,
            pretrain_task="reverse",
            pretrain_steps=150,
            pretrain_batch_size=64,
            pretrain_lr=3e-3,
            pretrain_min_digits=DIGITS["min_digits"],
            pretrain_max_digits=DIGITS["max_digits"],
            pretrain_period_fraction=0.6,
        ),
    ),
    rl=RLConfig(
        # A small batch keeps training below generation (a rollout's time is mostly
        # per generated token, a trainer's per sample); the habit is a strong enough
        # signal to learn from 12 samples an iteration.
        max_steps=40,
        stage_timeout_seconds=300,  # a CPU stage takes seconds; five minutes means stuck
        batch_size=12,
        epochs=1,
        minibatch_size=12,
        micro_batch_size=12,
        kl_coef=0.01,
        save_every=10,
        data=DataConfig(
            factory="data.synthetic:reverse_digits_split",
            factory_kwargs={"num_rows": 20000, "seed": 0, "split": "train", **DIGITS},
        ),
        reward=RewardConfig(terminal="exact_match"),
        # A fine-tuning rate: 1e-4 also removes the habit but loses some of the digits.
        optimizer=OptimizerConfig(policy_lr=5e-5, critic_lr=1e-3, warmup_steps=5),
        rollout=RolloutConfig(engine="hf", max_new_tokens=21, temperature=0.5),  # 20 digits and EOS
        # S-OPS-2: 256 held-out strings, greedy, before training and every 10 iterations.
        validation=ValidationConfig(
            data=DataConfig(
                factory="data.synthetic:heldout_reversals", factory_kwargs={"num_rows": 256, **DIGITS}, shuffle=False
            ),
            every=10,
        ),
    ),
)
