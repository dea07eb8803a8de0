"""CPU profile: PPO post-trains a tiny model that must call a tool to answer.

The question "value of QX?" names a key; the value (three digits) is hidden and drawn
afresh for every row, so the only way to the reward is the `get` tool of
environments/key_lookup.py: call `get(key)`, read the value in the tool's answer,
answer with it. The tiny character-level Qwen3 is born with a short supervised pass
over whole episodes (`model.tiny.pretrain_task="tool_lookup"`, cached in the model
folder) in which a share of the episodes answers at once with a wrong value instead of
looking it up (`pretrain_period_fraction`): the habit PPO has to remove.
`python -m bench.tools_task_eval` plays held-out episodes with the model, greedy and
sampled, and prints how often it succeeds and how often it looks the value up.

Not yet a learning profile: with this recipe the model calls `get` but copies the key
wrongly, so no held-out episode succeeds and PPO finds no reward (figures in
docs/howto/environments.md, "The tiny agent profile"). It runs every part of a
multi-turn run end to end: tool calls, tool answers, parse errors answered and counted.
"""

from configs.schema import (
    DataConfig,
    EnvConfig,
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

# The character set the tool task writes: keys, values, the prompt, the tools line,
# Qwen3's tool-call JSON and the tool's replies (the spec refuses an alphabet without it).
TOOL_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" + ' <>/_{}":,()?'

ENV = EnvConfig(
    factory="environments.key_lookup:make_environment",
    max_turns=3,  # look up, answer, and one turn to spare
    max_turn_tokens=96,  # a `get` call is 69 characters and the EOS
    max_episode_tokens=448,  # within max_position_embeddings below
    step_timeout_seconds=5.0,
)

CONFIG = PPOConfig(
    job=JobConfig(name="tiny-tools-cpu", output_root="outputs", seed=0),
    model=ModelConfig(
        # The folder name carries the pre-training recipe: the folder is the cache.
        path="outputs/_models/tiny-qwen3-tools-get-p300-guess50",
        tiny=TinyModelSpec(
            task_alphabet=TOOL_ALPHABET,
            max_position_embeddings=512,  # a whole episode is about 185 tokens; a wandering one is longer
            pretrain_task="tool_lookup",
            pretrain_steps=300,
            pretrain_batch_size=32,
            pretrain_lr=3e-3,
            pretrain_period_fraction=0.5,  # the share of episodes that answer without looking the value up
        ),
    ),
    rl=RLConfig(
        max_steps=60,
        batch_size=64,
        stage_timeout_seconds=300,  # a batch of episodes takes seconds here
        epochs=2,
        minibatch_size=32,
        micro_batch_size=32,
        kl_coef=0.01,
        save_every=20,
        data=DataConfig(
            factory="data.synthetic:key_lookup_split",
            factory_kwargs={"num_rows": 20000, "seed": 0, "split": "train"},
        ),
        # The environment's step rewards the episode's final answer (ENV above).
        reward=RewardConfig(terminal="none"),
        optimizer=OptimizerConfig(policy_lr=1e-4, critic_lr=1e-3, warmup_steps=5),
        # Temperature 1.0: the greedy answer skips the tool for most questions, sampling finds it.
        rollout=RolloutConfig(engine="hf", temperature=1.0),
        env=ENV,
        # Held-out keys and values, greedy: how often the policy looks the value up and answers with it.
        validation=ValidationConfig(
            data=DataConfig(
                factory="data.synthetic:key_lookup_split",
                factory_kwargs={"num_rows": 128, "seed": 1, "split": "heldout"},
                shuffle=False,
            ),
            every=10,
        ),
    ),
)
