"""CPU profile: PPO post-trains a tiny model that must call a tool to answer.

The question "value of GN" names a key; the value (three digits) is hidden and drawn
afresh for every row, so the only way to the reward is the `get` tool of
environments/key_lookup.py: call `get(key)`, read the value in the tool's answer,
answer with it. The tiny character-level Qwen3 is born with a short supervised pass
over whole episodes (`model.tiny.pretrain_task="tool_lookup"`, cached in the model
folder) with a habit PPO has to remove: asked the bare question, 60 % of those
episodes answer "unknown" instead of looking the value up; asked "look up GN" (a
quarter of the rows), every one looks it up. So greedy episodes succeed about only
when told to look up, while sampled ones find the reward for bare questions too, and
PPO turns that into calling the tool for every question: greedy held-out success rose
from 0.24 to 0.91 within 10 iterations here (docs/howto/environments.md, "The tiny agent
profile"). `python -m bench.tools_task_eval` plays the starting model's held-out
episodes, greedy and sampled (docs/performance.md, "Tool use").
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

# The characters the tool task writes: keys, values, the prompts, the tools line, the
# tool-call JSON and the tool's replies (the spec refuses an alphabet without them).
TOOL_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" + ' <>/_{}":,()'

ENV = EnvConfig(
    factory="environments.key_lookup:make_environment",
    max_turns=3,  # look up, answer, and one turn to spare
    max_turn_tokens=64,  # a `get` call is 48 tokens and its EOS
    max_episode_tokens=320,  # the opening, three turns and two tool answers
    step_timeout_seconds=5.0,
)

CONFIG = PPOConfig(
    job=JobConfig(name="tiny-tools-cpu", output_root="outputs", seed=0),
    model=ModelConfig(
        # The folder name carries the pre-training recipe: the folder is the cache.
        path="outputs/_models/tiny-qwen3-tools-h48-p1000-unknown60",
        tiny=TinyModelSpec(
            task_alphabet=TOOL_ALPHABET,
            hidden_size=48,  # width 64 trains slower per step; 32 learned only one of the two copies
            intermediate_size=96,
            max_position_embeddings=512,  # an episode is about 135 tokens; a wandering one longer
            pretrain_task="tool_lookup",
            pretrain_steps=1000,
            pretrain_batch_size=16,
            pretrain_lr=3e-3,
            pretrain_period_fraction=0.6,  # bare questions answered "unknown" instead of looked up
        ),
    ),
    rl=RLConfig(
        max_steps=30,  # held-out success levels off by iteration 10
        stage_timeout_seconds=300,  # a CPU stage takes seconds; five minutes means stuck
        batch_size=64,
        epochs=2,
        minibatch_size=32,
        micro_batch_size=32,
        # Most episodes end after one turn, a few run three: cut by tokens, each micro-batch
        # is as wide as its own longest episode, not the batch's (docs/performance.md, "Padding").
        micro_batch_tokens=1024,
        kl_coef=0.01,
        save_every=10,
        data=DataConfig(
            factory="data.synthetic:key_lookup_split",
            factory_kwargs={"num_rows": 20000, "seed": 0, "split": "train"},
        ),
        # The environment's step rewards the episode's final answer (ENV above).
        reward=RewardConfig(terminal="none"),
        optimizer=OptimizerConfig(policy_lr=1e-4, critic_lr=1e-3, warmup_steps=5),
        # Temperature 1.0: greedy skips the tool on bare questions, sampling calls it about half the time.
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
