"""`python -m deployments.own --profile FILE --name NAME`: the deployment `ppo/NAME`
of your own profile (`make deploy PROFILE=... NAME=...`).

The bundled deployments (deployments/prefect.yaml) name bundled profiles; starting one
of them with `profile=` pointing at yours would label every run with its name. This
creates a deployment of the same `ppo` flow under your name, on the same work pool,
with your profile as its `profile` parameter and your profile's folder in the flow
run's PPO_PROFILE_DIRS: a deployment loads profiles only from configs/ or folders the
operator names (S-SEC-2), and the folder's modules (your reward) then import in the
flow run and every actor as on the command line (S-BYO-3). The profile is checked
first, the way `--validate-manifest` checks it, so a broken one is refused here
rather than in the UI.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
POOL = "ppo-process"
ENTRYPOINT = "flows/training.py:ppo"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deployments.own", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="your profile file, e.g. my-project/my_profile.py")
    parser.add_argument("--name", required=True, help="the deployment's name: the UI shows ppo/NAME")
    parser.add_argument("--pool", default=POOL, help=f"the work pool (default {POOL}, which `make serve` creates)")
    parser.add_argument("--auto-resume-attempts", type=int, default=1,
                        help="resume a failed stage by itself this many times (the flow's auto_resume_attempts)")
    return parser.parse_args(argv)


def checked_profile(profile: Path) -> list[str]:
    """The problems `--validate-manifest` would print for this profile, as `key: message`."""
    from configs.loading import ConfigError, load_config
    from rundir.preflight_checks import check_manifest

    try:
        config = load_config(profile)
    except ConfigError as error:
        return error.problems
    return [str(problem) for problem in check_manifest(config).problems]


def deploy(profile: Path, name: str, pool: str, auto_resume_attempts: int) -> str:
    """Create or update `ppo/<name>`; returns its id."""
    from prefect import flow

    ppo = flow.from_source(source=str(REPO_ROOT), entrypoint=ENTRYPOINT)
    deployment_id = ppo.deploy(
        name=name,
        work_pool_name=pool,
        parameters={"profile": str(profile), "overrides": [], "auto_resume_attempts": auto_resume_attempts},
        job_variables={"env": {"PPO_PROFILE_DIRS": str(profile.parent)}},
        description=f"Your own profile, {profile} (deployments/own.py).",
        tags=["ppo", "own"],
        print_next_steps=False,
    )
    return str(deployment_id)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if not _NAME.match(args.name):
        print(f"error: --name {args.name!r}: one word of letters, digits, '.', '_' or '-'", file=sys.stderr)
        return 2
    profile = Path(args.profile).resolve()
    problems = checked_profile(profile)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    deployment_id = deploy(profile, args.name, args.pool, args.auto_resume_attempts)
    print(f"deployment ppo/{args.name} ({deployment_id}) runs {profile} on pool {args.pool!r}")
    print(f"  run it: prefect deployment run ppo/{args.name} --watch   (or Run in the UI)")
    print("  follow a run to its end and why it ended: make watch RUN=<its run_name or id>")
    return 0


if __name__ == "__main__":
    sys.exit(main())
