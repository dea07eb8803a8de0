"""`python -m flows.ppo --config FILE [--validate-manifest] [--fresh] [-- key=value ...]`."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from configs.loading import ConfigError, load_config


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        split = argv.index("--")
        argv, overrides = argv[:split], argv[split + 1 :]
    else:
        overrides = []
    parser = argparse.ArgumentParser(prog="python -m flows.ppo", description="Run PPO as a Prefect flow over Ray role actors.")
    parser.add_argument("--config", required=True, help="profile file, e.g. configs/ppo_tiny_cpu.py")
    parser.add_argument("--validate-manifest", action="store_true", help="check the whole run without starting workers, then exit")
    parser.add_argument("--fresh", action="store_true", help="start a new run instead of resuming (refused if the run has a committed boundary)")
    parser.add_argument("--critic-warmup-iterations", type=int, default=None, help="override rl.critic_warmup_iterations")
    return parser.parse_args(argv), overrides


def main(argv: list[str] | None = None, flow_fn: Callable | None = None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if args.validate_manifest:
        # Before anything else: the manifest reports config errors in its own
        # every-problem format and must not import Prefect or Ray (S-RUN-3).
        from flows.manifest import validate_manifest

        warmup = args.critic_warmup_iterations
        extra = [] if warmup is None else [f"rl.critic_warmup_iterations={warmup}"]
        return validate_manifest(args.config, overrides + extra)
    try:
        config = load_config(args.config, overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if flow_fn is None:
        from flows.ppo import ppo as flow_fn
    print(f"ppo: run {config.job.name!r}, {config.rl.max_steps} iterations, outputs in "
          f"{config.job.output_root}/{config.job.name}", flush=True)
    from checkpoint.boundary import CheckpointError
    from flows.ppo import StageFailed
    from flows.resume import ResumeError

    try:
        summary = flow_fn(
            profile=args.config,
            overrides=overrides,
            critic_warmup_iterations=args.critic_warmup_iterations,
            resume=not args.fresh,
        )
    except (ConfigError, ResumeError, CheckpointError) as error:
        # Refusals about the run's own state: the message is the whole story.
        print(f"error: {error}", file=sys.stderr)
        return 2
    except StageFailed as error:
        # The traceback is above (Prefect logs it) and in the UI; end on where it broke.
        print(f"error: {error}\n  run it again to resume from the last committed boundary", file=sys.stderr)
        return 1
    print_summary(summary)
    return 0


def print_summary(summary: dict) -> None:
    print("")
    print(f"done: run {summary['run_name']} at policy_version {summary['policy_version']}")
    if summary.get("actor_untouched"):
        print("  critic warmup covered every iteration: the actor was not updated (policy_version 0)")
    if summary.get("first_reward_mean") is not None:
        n = summary["reward_window"]
        first, last = summary["first_reward_mean"], summary["last_reward_mean"]
        print(f"  reward: first-{n} mean {first:.3f} -> last-{n} mean {last:.3f} (rise {last - first:+.3f})")
    print(f"  metrics:     {summary['run_dir']}/metrics.jsonl")
    print(f"  checkpoints: {summary['run_dir']}/checkpoints (last committed: {summary['last_boundary']})")
    if summary.get("final_model"):
        print(f"  final model: {summary['final_model']['policy']} (load with transformers' from_pretrained)")
