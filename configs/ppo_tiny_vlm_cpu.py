"""CPU profile for vision-language PPO: a tiny Qwen2.5-VL built locally, copying a
digit from prompts that mix text-only, image and video rows (S-RUN-6).

The multimodal path end to end with no download: every role scores and trains on the
pixels the rollout generated from. Point it at your own file with `-- rl.data.path=rows.jsonl`
(payload forms: docs/howto/custom-datapacker.md).
"""

from configs.schema import (
    DataConfig,
    JobConfig,
    ModelConfig,
    PPOConfig,
    RLConfig,
    RolloutConfig,
    TinyModelSpec,
    TinyVisionSpec,
    ValidationConfig,
)

CONFIG = PPOConfig(
    job=JobConfig(name="tiny-vlm-cpu", output_root="outputs", seed=0),
    model=ModelConfig(
        path="outputs/_models/tiny-qwen25vl-digits",
        tiny=TinyModelSpec(task_alphabet="0123456789", vision=TinyVisionSpec()),
    ),
    rl=RLConfig(
        max_steps=10,
        stage_timeout_seconds=300,  # a CPU stage takes seconds; five minutes means stuck
        batch_size=16,
        epochs=2,
        minibatch_size=8,
        micro_batch_size=8,
        kl_coef=0.01,
        save_every=5,
        data=DataConfig(
            factory="data.synthetic_vision:copy_digit_with_pictures", factory_kwargs={"num_rows": 300, "seed": 0}
        ),
        rollout=RolloutConfig(engine="hf", max_new_tokens=1),
        # S-OPS-2: rows of the same three kinds from another seed, greedy. The copy task
        # has only ten answers, so these prompts differ from training's in pictures only.
        validation=ValidationConfig(
            data=DataConfig(
                factory="data.synthetic_vision:copy_digit_with_pictures", factory_kwargs={"num_rows": 12, "seed": 1},
                shuffle=False,
            ),
            every=10,
        ),
    ),
)
