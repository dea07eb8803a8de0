"""The command line's arguments, shared by `python -m flows.ppo` and
`python -m cli.manifest` (which must not import the flow to start fast)."""

from __future__ import annotations

import argparse


def parse_args(argv: list[str], prog: str = "python -m flows.ppo") -> tuple[argparse.Namespace, list[str]]:
    """Options, then `key=value` overrides after `--` (S-RUN-2)."""
    if "--" in argv:
        split = argv.index("--")
        argv, overrides = argv[:split], argv[split + 1 :]
    else:
        overrides = []
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} --config FILE [options] [-- key=value ...]",
        description="Run PPO as a Prefect flow over Ray role actors.",
        epilog="Overrides go after `--` as dotted config keys, e.g. `-- rl.max_steps=5 job.name=try1 "
        "model.path=/models/mine` (every key: docs/reference/config.md; your own model, data and reward: "
        "docs/howto/your-own-model.md).",
    )
    parser.add_argument("--config", required=True, help="profile file, e.g. configs/ppo_tiny_cpu.py")
    parser.add_argument(
        "--validate-manifest", action="store_true", help="check the whole run without starting workers, then exit"
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--fresh",
        action="store_true",
        help="start a new run instead of resuming (refused if the run has a committed boundary)",
    )
    start.add_argument(
        "--resume-from", default=None, metavar="iter_NNNNNN",
        help="go back to this earlier committed boundary (verified first); later metrics rows are set aside",
    )
    parser.add_argument(
        "--critic-warmup-iterations", type=int, default=None, help="override rl.critic_warmup_iterations"
    )
    return parser.parse_args(argv), overrides


def warmup_override(args: argparse.Namespace) -> list[str]:
    warmup = args.critic_warmup_iterations
    return [] if warmup is None else [f"rl.critic_warmup_iterations={warmup}"]
