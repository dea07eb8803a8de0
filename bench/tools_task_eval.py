"""Held-out episodes of the key-lookup tool task, played through the run's own episode loop.

Why: the tool profile claims its pre-trained model leaves PPO room to improve: greedy
episodes look the value up only when the prompt says "look up", sampled ones also call
`get` for the bare question and succeed there sometimes. This plays held-out rows
(keys and values never pre-trained on) turn by turn on the transformers engine, greedy
and sampled at temperature 1.0, with the profile's `rl.env` limits, and prints the
success rate, the share of episodes that looked the value up, and the pre-training's
time, with the load average beside every timing (docs/performance.md, "Tool use").

    .venv/bin/python -m bench.tools_task_eval
    .venv/bin/python -m bench.tools_task_eval -- model.tiny.pretrain_steps=200 model.tiny.pretrain_lr=2e-3

An override of `model.tiny` without `model.path` builds into
outputs/_models/tools-eval-<spec digest>, so a recipe under test never lands in the
profile's cache folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from data.synthetic import KEY_QUESTION, key_lookup_split
from environments.chat_tokens import opening_ids
from environments.key_lookup import make_environment
from environments.factory import episode_runner
from environments.protocol import EnvRow
from environments.tool_calls import parse_tool_calls

from bench.overrides import split_overrides

TOOLS_PROFILE = "configs/ppo_tiny_tools_cpu.py"


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


@dataclass(frozen=True)
class Played:
    row: dict
    reward: float
    messages: list[dict]
    cut: bool

    @property
    def looked_up(self) -> bool:  # some tool reply carried the hidden value
        return any(m["role"] == "tool" and m["content"] == self.row["reference"] for m in self.messages)

    @property
    def first_turn_called(self) -> bool:
        assistant = [m for m in self.messages if m["role"] == "assistant"]
        return bool(assistant) and bool(parse_tool_calls(assistant[0]["content"]).tool_calls)

    @property
    def texts(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "assistant"]


def play(engine, tokenizer, config, rows: list[dict], *, greedy: bool, seed: int):
    """One episode per row through the run's own episode loop (environments/episodes.py)
    with the profile's `rl.env` limits, on the transformers engine, as the rollout plays them."""
    env_rows = [EnvRow(r["prompt"], r["reference"], {"key": r["key"]}, i, "key_lookup_split heldout")
                for i, r in enumerate(rows)]
    batch = episode_runner(config, tokenizer).run(
        engine, env_rows, [seed] * len(rows), temperature=1.0, generation_seed=seed, greedy=greedy
    )
    return [
        Played(row, float(rewards.sum()), transcript.messages, transcript.cut)
        for row, rewards, transcript in zip(rows, batch.turn_rewards, batch.transcripts)
    ]


@torch.no_grad()
def first_call_probability(model, tokenizer, rows: list[dict]) -> list[float]:
    """Per row, the probability that the opening turn starts with `<tool_call>`: how far
    each greedy decision is from flipping."""
    call_id = tokenizer.convert_tokens_to_ids("<tool_call>")
    if call_id == tokenizer.unk_token_id:
        return []
    reset_rows = [make_environment().reset(EnvRow(r["prompt"], r["reference"], {"key": r["key"]}, i), 0)
                  for i, r in enumerate(rows)]
    ids = [opening_ids(tokenizer, reset.messages, reset.tools) for reset in reset_rows]
    width = max(map(len, ids))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    attention_mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(i) for i in ids])[:, None]).long()
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[:, -1]
    return logits.softmax(-1)[:, call_id].tolist()


def summarise(name: str, episodes: list[Played], seconds: float) -> str:
    n = len(episodes)
    success = sum(e.reward == 1.0 for e in episodes) / n
    bare = [e for e in episodes if e.row["prompt"] == KEY_QUESTION.format(key=e.row["key"])]
    bare_success = sum(e.reward == 1.0 for e in bare) / max(1, len(bare))
    looked_up = sum(e.looked_up for e in episodes) / n
    called = sum(e.first_turn_called for e in episodes) / n
    unfinished = sum(e.cut for e in episodes) / n
    return (
        f"{name:8s} success {success:.3f} (bare question {bare_success:.3f})  looked the value up {looked_up:.3f}  "
        f"called a tool first {called:.3f}  "
        f"cut by a limit {unfinished:.3f}  ({n} episodes, {seconds:.1f} s, {load()})"
    )


def _with_eval_path(overrides: list[str], tiny: dict) -> list[str]:
    if any(o.startswith("model.path=") for o in overrides) or not any(o.startswith("model.tiny.") for o in overrides):
        return overrides
    digest = hashlib.sha256(json.dumps(tiny, sort_keys=True).encode()).hexdigest()[:10]
    return [*overrides, f"model.path=outputs/_models/tools-eval-{digest}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools_task_eval", description=__doc__.strip().splitlines()[0]
    )
    parser.add_argument(
        "--profile", default=TOOLS_PROFILE, help=f"profile whose model to build (default {TOOLS_PROFILE})"
    )
    parser.add_argument("--rows", type=int, default=200, help="held-out rows (one greedy and one sampled episode each)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the held-out rows and of the sampling")
    parser.add_argument("--show", type=int, default=3, help="print this many sampled episodes")
    argv, overrides = split_overrides(argv)
    args = parser.parse_args(argv)

    from configs.loading import load_config
    from models.model_io import ensure_model, load_tokenizer
    from roles.rollout.hf_engine import HFEngine

    config = load_config(args.profile, overrides)
    config = load_config(args.profile, _with_eval_path(overrides, config.model.tiny.model_dump(mode="json")))
    recipe = config.model.tiny.model_dump(exclude_defaults=True, exclude={"task_alphabet"})
    print(f"model {config.model.path}: {recipe}")
    started, load_before = time.perf_counter(), load()
    built = not (Path(config.model.path) / "config.json").exists()
    model_dir = Path(ensure_model(config.model))
    if built:
        print(f"built in {time.perf_counter() - started:.1f} s ({load_before} before, {load()} after)")
    report_file = model_dir / "tiny_pretrain.json"
    if report_file.exists():
        report = json.loads(report_file.read_text())
        print(f"pre-training: {report['steps']} steps, {report['seconds']:.1f} s, loss {report['first_loss']:.3f} -> "
              f"{report['last_loss']:.3f}" + ("" if built else " (recorded when the model was built)"))

    torch.set_num_threads(1)
    tokenizer = load_tokenizer(str(model_dir))
    engine = HFEngine(str(model_dir), "float32", tokenizer.eos_token_id, tokenizer.pad_token_id)
    model = engine.model
    rows = list(key_lookup_split(args.rows, seed=args.seed, split="heldout"))
    probabilities = sorted(first_call_probability(model, tokenizer, rows))
    if probabilities:
        n = len(probabilities)
        print(f"P(first turn opens <tool_call>) over held-out prompts: mean {sum(probabilities) / n:.3f}, "
              f"10/50/90 % {probabilities[n // 10]:.3f} / {probabilities[n // 2]:.3f} / "
              f"{probabilities[9 * n // 10]:.3f}")
    for name, greedy in (("greedy", True), ("sampled", False)):
        started = time.perf_counter()
        episodes = play(engine, tokenizer, config, rows, greedy=greedy, seed=args.seed)
        print(summarise(name, episodes, time.perf_counter() - started), flush=True)
    for e in episodes[: args.show]:
        print(f"  {e.row['prompt']} (value {e.row['reference']}, reward {e.reward}): {e.texts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
