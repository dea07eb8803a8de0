"""Concurrent environment steps: does a slow tool serialise the batch? (S-ENV, the
agents issue's benchmark.)

64 episodes of 3 turns each on the tiny arithmetic model (it answers a sum and ends
its turn, so every episode runs all its turns), with an environment whose step calls
a tool that sleeps `--sleep` seconds, against the same episodes with an instant tool.
The figure asked for: slow/instant at most 2x. A run with one step at a time
(`rl.env.max_concurrency=1`) is printed beside them, to show what concurrency buys.
Medians of `--repeats`, the load average before and after each.

    .venv/bin/python -m bench.env_concurrency [--episodes 64] [--turns 3] [--sleep 0.1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

ARITH_PROFILE = "configs/ppo_tiny_arith_cpu.py"


class SumsWithATool:
    """Asks a sum each turn; a step first calls a tool that takes `sleep` seconds."""

    def __init__(self, turns: int, sleep: float):
        self.turns, self.sleep, self.turn = turns, sleep, 0

    def _sum(self) -> str:
        return f"{self.rng.randrange(100)}+{self.rng.randrange(100)}="

    def reset(self, row, seed: int):
        from environments.protocol import Reset

        self.rng = random.Random(seed)
        return Reset([{"role": "user", "content": self._sum()}])

    def step(self, message):
        from environments.protocol import Step

        time.sleep(self.sleep)  # the tool
        self.turn += 1
        if self.turn >= self.turns:
            return Step([], 1.0, True)
        return Step([{"role": "user", "content": self._sum()}], 0.0, False)


def _load() -> str:
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def measure(engine, tokenizer, episodes: int, turns: int, sleep: float, concurrency: int, repeats: int):
    from environments.episodes import EpisodeLimits, EpisodeRunner
    from environments.protocol import EnvRow

    limits = EpisodeLimits(
        max_turns=turns, max_turn_tokens=8, max_episode_tokens=200, step_timeout_seconds=60.0, on_error="fail",
        max_concurrency=concurrency, factory_name="bench.env_concurrency:SumsWithATool",
    )
    runner = EpisodeRunner(tokenizer, lambda: SumsWithATool(turns, sleep), limits)
    rows = [EnvRow("", None, {}, row_id=i) for i in range(episodes)]
    seconds, turns_mean = [], 0.0
    for repeat in range(repeats):
        started = time.perf_counter()
        batch = runner.run(engine, rows, list(range(episodes)), temperature=1.0, generation_seed=repeat, greedy=False)
        seconds.append(time.perf_counter() - started)
        turns_mean = batch.metrics["env/turns_mean"]
    return statistics.median(seconds), turns_mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from configs.loading import load_profile
    from models.model_io import ensure_model, load_tokenizer
    from roles.rollout.hf_engine import HFEngine

    torch.set_num_threads(1)  # as a rollout actor runs (rl.threads_per_role)
    model_path = ensure_model(load_profile(ARITH_PROFILE).model)
    tokenizer = load_tokenizer(model_path)
    engine = HFEngine(model_path, "float32", tokenizer.eos_token_id, tokenizer.pad_token_id)
    print(f"{args.episodes} episodes x {args.turns} turns, tiny arithmetic model ({model_path}); {_load()}")
    runs = {}
    for name, sleep, concurrency in (
        ("instant tool", 0.0, 64), (f"tool sleeping {args.sleep:g} s", args.sleep, 64),
        (f"tool sleeping {args.sleep:g} s, one step at a time", args.sleep, 1),
    ):
        median, turns_mean = measure(engine, tokenizer, args.episodes, args.turns, sleep, concurrency, args.repeats)
        runs[name] = median
        print(f"  {name:<45} median {median:6.2f} s over {args.repeats}  (turns/episode {turns_mean:.2f}; {_load()})")
    instant, slow = list(runs.values())[:2]
    print(f"slow tool / instant tool: {slow / instant:.2f}x (target: at most 2x)")


if __name__ == "__main__":
    main()
