"""Held-out episodes of the key-lookup tool task, played with transformers `generate`.

Why: the tool profile claims its pre-trained model leaves PPO room to improve: greedy
episodes look the value up only when the prompt says "look up", sampled ones also call
`get` for the bare question and succeed there sometimes. This plays held-out rows
(keys and values never pre-trained on) turn by turn as the episode loop does, greedy
and sampled at temperature 1.0, and prints the success rate, the share of episodes
that looked the value up, and the pre-training's time, with the load average beside
every timing (docs/performance.md, "Tool use").

    .venv/bin/python -m bench.tools_task_eval
    .venv/bin/python -m bench.tools_task_eval -- model.tiny.seed=1 model.tiny.pretrain_steps=1400

An override of `model.tiny` without `model.path` builds into
outputs/_models/tools-eval-<spec digest>, so a recipe under test never lands in the
profile's cache folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data.synthetic import KEY_QUESTION, key_lookup_split
from environments.key_lookup import make_environment
from environments.protocol import EnvRow, checked_reset, checked_step

TOOLS_PROFILE = "configs/ppo_tiny_tools_cpu.py"
# Qwen3's form; environments/tool_calls.py will own the parser, this one is the bench's.
TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def parse_assistant(text: str) -> dict:
    """The assistant message the environment's step gets: well-formed `<tool_call>`
    blocks become `tool_calls`; everything else (a malformed block too) is content."""
    calls, kept = [], []
    position = 0
    for block in TOOL_CALL.finditer(text):
        try:
            parsed = json.loads(block.group(1))
        except json.JSONDecodeError:
            continue
        if not (isinstance(parsed, dict) and isinstance(parsed.get("name"), str)):
            continue
        calls.append({"type": "function", "function": {"name": parsed["name"], "arguments": parsed.get("arguments")}})
        kept.append(text[position : block.start()])
        position = block.end()
    kept.append(text[position:])
    message: dict = {"role": "assistant", "content": "".join(kept)}
    if calls:
        message["tool_calls"] = calls
    return message


@dataclass
class Episode:
    row: dict
    environment: object
    tools: list | None
    history: list[dict]
    token_ids: list[int]
    reward: float = 0.0
    done: bool = False
    turns: int = 0
    looked_up: bool = False  # some tool reply carried the hidden value
    first_turn_called: bool = False
    texts: list[str] = field(default_factory=list)


def render(tokenizer, messages: list[dict], tools, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
    )


@torch.no_grad()
def play(model, tokenizer, rows: list[dict], *, greedy: bool, max_turns: int, max_turn_tokens: int, seed: int):
    """One episode per row, all rows' turns batched: the opening prompt, then per turn
    a generation up to the EOS, the environment's step, and the observation (what the
    template adds after the turn's EOS for the new messages and a generation prompt)."""
    eos = tokenizer.eos_token
    episodes = []
    for index, row in enumerate(rows):
        environment = make_environment()
        env_row = EnvRow(row["prompt"], row["reference"], {"key": row["key"]}, index, "key_lookup_split heldout")
        reset = checked_reset(environment.reset(env_row, seed))
        prompt = render(tokenizer, reset.messages, reset.tools, True)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        episodes.append(Episode(row, environment, reset.tools, list(reset.messages), ids))
    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    for turn in range(max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        width = max(len(e.token_ids) for e in active)
        input_ids = torch.full((len(active), width), tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, e in enumerate(active):  # left padding, as the rollout packs prompts
            input_ids[i, width - len(e.token_ids) :] = torch.tensor(e.token_ids)
            attention_mask[i, width - len(e.token_ids) :] = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1000 + turn)
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                **sampling,
                max_new_tokens=max_turn_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        for e, response in zip(active, output[:, width:].tolist()):
            ended = tokenizer.eos_token_id in response
            response = response[: response.index(tokenizer.eos_token_id) + 1] if ended else response
            text = tokenizer.decode([t for t in response if t != tokenizer.eos_token_id])
            e.texts.append(text)
            e.token_ids += response
            e.turns += 1
            message = parse_assistant(text)
            step = checked_step(e.environment.step(message))
            if turn == 0:
                e.first_turn_called = "tool_calls" in message
            e.looked_up |= any(m["role"] == "tool" and m["content"] == e.row["reference"] for m in step.messages)
            e.history.append(message)
            if step.done or not ended:  # a turn cut off before its EOS ends the episode unrewarded
                e.done, e.reward = True, step.reward if ended else 0.0
                continue
            closed = render(tokenizer, e.history, e.tools, False)
            turn_end = closed.rindex(eos) + len(eos)
            e.history += step.messages
            observation = render(tokenizer, e.history, e.tools, True)[turn_end:]
            e.token_ids += tokenizer(observation, add_special_tokens=False)["input_ids"]
    return episodes


@torch.no_grad()
def first_call_probability(model, tokenizer, rows: list[dict]) -> list[float]:
    """Per row, the probability that the opening turn starts with `<tool_call>`: how far
    each greedy decision is from flipping."""
    call_id = tokenizer.convert_tokens_to_ids("<tool_call>")
    if call_id == tokenizer.unk_token_id:
        return []
    reset_rows = [make_environment().reset(EnvRow(r["prompt"], r["reference"], {"key": r["key"]}, i), 0)
                  for i, r in enumerate(rows)]
    prompts = [render(tokenizer, reset.messages, reset.tools, True) for reset in reset_rows]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, ids))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    attention_mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(i) for i in ids])[:, None]).long()
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[:, -1]
    return logits.softmax(-1)[:, call_id].tolist()


def summarise(name: str, episodes: list[Episode], seconds: float) -> str:
    n = len(episodes)
    success = sum(e.reward == 1.0 for e in episodes) / n
    bare = [e for e in episodes if e.row["prompt"] == KEY_QUESTION.format(key=e.row["key"])]
    bare_success = sum(e.reward == 1.0 for e in bare) / max(1, len(bare))
    looked_up = sum(e.looked_up for e in episodes) / n
    called = sum(e.first_turn_called for e in episodes) / n
    unfinished = sum(not e.done for e in episodes) / n
    return (
        f"{name:8s} success {success:.3f} (bare question {bare_success:.3f})  looked the value up {looked_up:.3f}  "
        f"called a tool first {called:.3f}  unfinished {unfinished:.3f}  ({n} episodes, {seconds:.1f} s, {load()})"
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
    parser.add_argument("--profile", default=TOOLS_PROFILE, help=f"profile of the model (default {TOOLS_PROFILE})")
    parser.add_argument("--rows", type=int, default=200, help="held-out rows (one greedy and one sampled episode each)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the held-out rows and of the sampling")
    parser.add_argument("--max-turns", type=int, default=3, help="as the profile's ENV['max_turns']")
    parser.add_argument("--max-turn-tokens", type=int, default=64, help="as the profile's ENV['max_turn_tokens']")
    parser.add_argument("--show", type=int, default=3, help="print this many sampled episodes")
    argv = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in argv:  # as in `python -m flows.ppo`: overrides follow a bare `--`
        split = argv.index("--")
        argv, overrides = argv[:split], argv[split + 1 :]
    args = parser.parse_args(argv)

    from configs.loading import load_config
    from models.model_io import ensure_model, load_causal_lm, load_tokenizer

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
    model = load_causal_lm(str(model_dir), "float32").eval()
    tokenizer = load_tokenizer(str(model_dir))
    rows = list(key_lookup_split(args.rows, seed=args.seed, split="heldout"))
    calls = sorted(first_call_probability(model, tokenizer, rows))
    if calls:
        n = len(calls)
        print(f"P(first turn opens <tool_call>) over held-out prompts: mean {sum(calls) / n:.3f}, "
              f"10/50/90 % {calls[n // 10]:.3f} / {calls[n // 2]:.3f} / {calls[9 * n // 10]:.3f}")
    for name, greedy in (("greedy", True), ("sampled", False)):
        started = time.perf_counter()
        episodes = play(model, tokenizer, rows, greedy=greedy, max_turns=args.max_turns,
                        max_turn_tokens=args.max_turn_tokens, seed=args.seed)
        print(summarise(name, episodes, time.perf_counter() - started), flush=True)
    for e in episodes[: args.show]:
        print(f"  {e.row['prompt']} (value {e.row['reference']}, reward {e.reward}): {e.texts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
