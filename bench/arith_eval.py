"""Held-out exact-match accuracy of a model on sums, decoded greedily.

Why: the arithmetic CPU profile claims PPO raises accuracy on sums the model never
trained on. Reward during training is measured on *sampled* completions of training
prompts; this measures the deterministic answer (greedy) on the held-out side of the
fixed split (`data.synthetic.heldout_sums`), scored by the same rule PPO is rewarded
with (`arithmetic_exact_match`).

    .venv/bin/python -m bench.arith_eval MODEL_DIR [MODEL_DIR ...]
    .venv/bin/python -m bench.arith_eval --run      # start model -> PPO (flow) -> final model
    .venv/bin/python -m bench.arith_eval --run -- job.name=arith2 rl.max_steps=30

`--run` evaluates the profile's pre-trained model (building it first if needed), runs
the `ppo` flow for the profile, evaluates the exported `final_model/policy`, and prints
both accuracies and the gain; `--run --direct` runs the same iterations through
`flows.in_process` instead (no Prefect/Ray start-up; same computation).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from algorithm.reward_rules import RewardContext, match_arithmetic_exact
from data.packing import ChatTextPacker
from data.synthetic import heldout_sums

from bench.overrides import split_overrides

ARITH_PROFILE = "configs/ppo_tiny_arith_cpu.py"


@torch.no_grad()
def greedy_completions(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 256) -> list[str]:
    """Greedy completions through the rollout's own packer (chat template, left padding)."""
    packer = ChatTextPacker(tokenizer)
    completions: list[str] = []
    model.eval()
    for start in range(0, len(prompts), batch_size):
        packed = packer.pack_prompts(prompts[start : start + batch_size])
        output = model.generate(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        response = output[:, packed.input_ids.shape[1] :]
        is_eos = response == tokenizer.eos_token_id
        after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
        completions.extend(packer.decode_completions(response, (~after_eos).float()))
    return completions


def exact_match_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int = 4) -> float:
    completions = greedy_completions(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens)
    hits = sum(
        match_arithmetic_exact(RewardContext(prompt=r["prompt"], completion=c, reference=r["reference"], metadata={}))
        for r, c in zip(rows, completions)
    )
    return hits / len(rows)


def evaluate_dir(model_dir: str, max_operand: int, max_new_tokens: int = 4) -> float:
    from models.model_io import load_causal_lm, load_tokenizer

    torch.set_num_threads(1)
    model = load_causal_lm(model_dir, "float32")
    tokenizer = load_tokenizer(model_dir)
    return exact_match_accuracy(model, tokenizer, heldout_sums(max_operand), max_new_tokens)


def _run_profile(profile: str, overrides: list[str], direct: bool) -> int:
    from configs.loading import load_config
    from cli.environment import apply_default_environment
    from models.model_io import ensure_model

    apply_default_environment()
    if not direct and not any(o.startswith("job.output_root=") for o in overrides):
        # A fresh run folder per measurement: `resume=False` refuses to overwrite a
        # run that already committed a boundary.
        overrides = [*overrides, f"job.output_root=outputs/bench/arith/{time.strftime('%Y%m%d-%H%M%S')}"]
    config = load_config(profile, overrides)
    max_operand = int(config.model.tiny.pretrain_max_operand) if config.model.tiny else 99
    max_new_tokens = config.rl.rollout.max_new_tokens
    started = time.perf_counter()
    start_dir = ensure_model(config.model)
    built = time.perf_counter() - started
    before = evaluate_dir(start_dir, max_operand, max_new_tokens)
    print(
        f"pre-trained start {start_dir}: held-out exact match {before:.3f} (model ready in {built:.0f} s)", flush=True
    )

    started = time.perf_counter()
    if direct:
        from flows.in_process import run_in_process

        records, roles = run_in_process(config)
        after = exact_match_accuracy(
            roles.policy.model, roles.policy.tokenizer, heldout_sums(max_operand), max_new_tokens
        )
        where, way = "policy after the direct loop", "direct loop"
        rewards = [r["train/reward_mean"] for r in records if "train/reward_mean" in r]  # row 0: evaluation only
        window = min(10, len(rewards))
        first, last = sum(rewards[:window]) / window, sum(rewards[-window:]) / window
    else:
        from flows.training import ppo

        summary = ppo(profile=profile, overrides=overrides, resume=False)
        if not summary.get("final_model"):
            print("error: the run exported no final model (rl.save_final=false?)", file=sys.stderr)
            return 2
        where, way = summary["final_model"]["policy"], "PPO flow"
        after = evaluate_dir(where, max_operand, max_new_tokens)
        window, first, last = summary["reward_window"], summary["first_reward_mean"], summary["last_reward_mean"]
    ppo_seconds = time.perf_counter() - started
    print(f"after PPO      {where}: held-out exact match {after:.3f}")
    print(f"gain {after - before:+.3f} absolute over {len(heldout_sums(max_operand))} held-out sums "
          f"(seed {config.job.seed}); {way} {ppo_seconds / 60:.1f} min for {config.rl.max_steps} iterations; "
          f"reward first-{window} {first:.3f} -> last-{window} {last:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arith_eval", description=__doc__.strip().splitlines()[0])
    parser.add_argument("model_dirs", nargs="*", help="Hugging Face model folders to evaluate")
    parser.add_argument(
        "--run", action="store_true", help="evaluate the profile's start model, run PPO, evaluate the result"
    )
    parser.add_argument(
        "--direct", action="store_true", help="with --run: PPO through flows.in_process instead of the flow"
    )
    parser.add_argument("--profile", default=ARITH_PROFILE, help=f"profile for --run (default {ARITH_PROFILE})")
    parser.add_argument("--max-operand", type=int, default=99, help="operand range of the held-out sums (model dirs)")
    argv, overrides = split_overrides(argv)
    args = parser.parse_args(argv)
    if args.run:
        return _run_profile(args.profile, overrides, args.direct)
    if not args.model_dirs:
        parser.error("give model folders to evaluate, or --run")
    for model_dir in args.model_dirs:
        if not (Path(model_dir) / "config.json").exists():
            print(f"error: {model_dir} has no config.json (not a Hugging Face model folder)", file=sys.stderr)
            return 2
        accuracy = evaluate_dir(model_dir, args.max_operand)
        print(f"{model_dir}: held-out exact match {accuracy:.3f} ({len(heldout_sums(args.max_operand))} sums)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
