"""Public 4-GPU profile: Qwen3-0.6B, vLLM rollout, 1000 PPO iterations.

Placement (S-RUN-1, S-RUN-4): policy and rollout colocated on two GPUs (the trainer
parks its state on the host while vLLM generates, vLLM sleeps while the trainer
updates), the frozen reference on one GPU, the critic on one GPU.
"""

from configs.schema import (
    DataConfig,
    GridConfig,
    JobConfig,
    ModelConfig,
    OptimizerConfig,
    PPOConfig,
    RLConfig,
    RolloutConfig,
)

CONFIG = PPOConfig(
    job=JobConfig(name="qwen06b-public-4gpu", output_root="outputs", seed=0),
    model=ModelConfig(path="Qwen/Qwen3-0.6B", dtype="bfloat16"),
    rl=RLConfig(
        max_steps=1000,
        stage_timeout_seconds=3600,  # generous: the first vLLM generation compiles and captures graphs
        batch_size=256,
        epochs=1,
        minibatch_size=64,
        micro_batch_size=8,
        gamma=1.0,
        lam=0.95,
        kl_coef=0.01,
        save_every=50,
        threads_per_role=4,
        data=DataConfig(
            factory="data.synthetic:addition", factory_kwargs={"num_rows": 100000, "seed": 0, "max_operand": 999}
        ),
        optimizer=OptimizerConfig(name="adamw_fused", policy_lr=1e-6, critic_lr=5e-6, warmup_steps=10),
        rollout=RolloutConfig(engine="vllm", max_new_tokens=64, temperature=1.0, gpu_memory_utilization=0.45),
    ),
    grid=GridConfig(
        backend="ray",
        gpu_placement="colocated",
        gpus_per_node=4,
        policy_gpus=2,
        reference_gpus=1,
        critic_gpus=1,
        ray_num_cpus=None,
    ),
)
