"""`python -m cli.cleanup RUN_NAME [--address auto]`: remove a run's leftover Ray actors.

A flow that ends (or fails) kills its own role actors. Leftovers are possible on a
standing Ray cluster (`ray start --head`, the flow joined with an address) when the
flow process hangs or is killed while Ray keeps its actors; they hold model weights
and memory until removed. Actors live in the run's namespace `ppo-<run name>`, so this
removes only that run's actors and never another run's.
"""

from __future__ import annotations

import argparse
import sys

from cli.environment import apply_default_environment


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cli.cleanup", description=__doc__.splitlines()[0])
    parser.add_argument("run_name", help="the run's job.name (its Ray namespace is ppo-<run_name>)")
    parser.add_argument(
        "--address",
        default="auto",
        help="Ray cluster to join: 'auto' (the local standing cluster, the default) or host:port",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    apply_default_environment()
    import ray

    from processes.actors import kill_run_actors
    from processes.ray_session import init_ray

    session = None
    if not ray.is_initialized():
        try:
            session = init_ray(address=args.address)
        except ConnectionError as error:
            # Without a standing cluster, a run's actors lived inside its own flow
            # process and died with it: there is nothing to remove.
            print(f"no Ray cluster at --address {args.address!r} ({error}); nothing to clean up", file=sys.stderr)
            return 1
    try:
        killed = kill_run_actors(args.run_name)
    finally:
        if session is not None:
            session.close()
    if killed:
        print(f"run {args.run_name!r}: killed actors {', '.join(killed)} in namespace ppo-{args.run_name}")
    else:
        print(f"run {args.run_name!r}: no actors left in namespace ppo-{args.run_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
