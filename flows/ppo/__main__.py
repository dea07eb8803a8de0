"""`python -m flows.ppo --config FILE [--validate-manifest] [--fresh] [-- key=value ...]`."""

import atexit
import os
import sys

from cli.environment import apply_default_environment

apply_default_environment()  # before Prefect is imported

_exit_code = [1]  # what the command exits with if `main` never returns (an uncaught error)


def _exit_without_teardown() -> None:
    """Registered before anything else, so it runs after every other exit handler
    (Prefect's log and event drains, Ray's, logging's), and after the threads Python
    waits for at exit; then the command ends without tearing down the thousands of
    modules the flow imported, which would only delay the prompt (docs/performance-log.md
    section 4, session 7)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_code[0])


atexit.register(_exit_without_teardown)

from cli.command import main  # noqa: E402

_exit_code[0] = main()
sys.exit(_exit_code[0])
