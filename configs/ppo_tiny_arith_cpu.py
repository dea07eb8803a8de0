"""CPU profile: PPO post-trains a tiny model that already half-knows addition.

The realistic shape of post-training on a laptop: the tiny Qwen3 model is born with a
short supervised pass over two-digit sums (`model.tiny.pretrain_*`, cached in the model
folder), then PPO raises its exact-match accuracy. `val/exact_match` tracks the held-out
sums; `python -m bench.arith_eval --run` measures them before and after
(docs/performance.md, "Arithmetic").
"""

from configs.schema import (
    DataConfig,
    JobConfig,
    ModelConfig,
    OptimizerConfig,
    PPOConfig,
    RLConfig,
    RolloutConfig,
    TinyModelSpec,
    ValidationConfig,
)

CONFIG = PPOConfig(
    job=JobConfig(name="tiny-arith-cpu", output_root="outputs", seed=0),
    model=ModelConfig(
        # The folder name carries the pre-training recipe: the folder is the cache, so
        # a different recipe must not silently reuse it.
        path="outputs/_models/tiny-qwen3-arith-add99-p250",
        tiny=TinyModelSpec(
            task_alphabet="0123456789+=",
            pretrain_task="addition",
            pretrain_steps=250,
            pretrain_batch_size=64,
            pretrain_lr=3e-3,
            pretrain_max_operand=99,
        ),
    ),
    rl=RLConfig(
        # A large batch and a cool rollout temperature keep the one-sample-per-prompt
        # signal above its noise; a fine-tuning learning rate with warmup keeps Adam's
        # first steps from wrecking what pre-training taught (docs/performance-log.md section 2).
        max_steps=60,
        stage_timeout_seconds=300,  # a CPU stage takes seconds; five minutes means stuck
        batch_size=512,
        epochs=2,
        minibatch_size=128,
        micro_batch_size=128,
        kl_coef=0.01,
        save_every=20,
        data=DataConfig(
            factory="data.synthetic:addition_split",
            factory_kwargs={"num_rows": 40000, "seed": 0, "max_operand": 99, "split": "train"},
        ),
        optimizer=OptimizerConfig(policy_lr=3e-4, critic_lr=1e-3, warmup_steps=10),
        rollout=RolloutConfig(engine="hf", max_new_tokens=4, temperature=0.5),
        # S-OPS-2: every held-out sum once, greedy, as bench/arith_eval.py measures it.
        validation=ValidationConfig(
            data=DataConfig(factory="data.synthetic:heldout_sums", factory_kwargs={"max_operand": 99}, shuffle=False),
            every=10,
        ),
    ),
)
