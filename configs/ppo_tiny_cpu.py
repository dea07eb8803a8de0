"""CPU profile: a tiny Qwen3 model built locally, learning to copy a digit.

Runs on any laptop in a few minutes with no download (S-RUN-1). The task is easy on
purpose: a random tiny model can learn it within the default run, so `make run`
shows the reward rise rather than a flat line.
"""

from configs.schema import (
    DataConfig,
    JobConfig,
    ModelConfig,
    PPOConfig,
    RLConfig,
    RolloutConfig,
    TinyModelSpec,
    ValidationConfig,
)

CONFIG = PPOConfig(
    job=JobConfig(name="tiny-cpu", output_root="outputs", seed=0),
    model=ModelConfig(path="outputs/_models/tiny-qwen3-digits", tiny=TinyModelSpec(task_alphabet="0123456789")),
    rl=RLConfig(
        max_steps=40,
        stage_timeout_seconds=300,  # a CPU stage takes seconds; five minutes means stuck
        batch_size=64,
        epochs=4,
        minibatch_size=16,
        micro_batch_size=16,
        kl_coef=0.01,
        save_every=10,
        data=DataConfig(factory="data.synthetic:copy_digit", factory_kwargs={"num_rows": 2000, "seed": 0}),
        rollout=RolloutConfig(engine="hf", max_new_tokens=1),
        # S-OPS-2: greedy on each digit once, before training and every 10 iterations.
        validation=ValidationConfig(data=DataConfig(factory="data.synthetic:each_digit", shuffle=False), every=10),
    ),
)
