"""`python -m flows.ppo --config FILE [--validate-manifest] [--fresh] [-- key=value ...]`."""

import sys

from flows.environment import apply_default_environment

apply_default_environment()  # before Prefect is imported

import atexit  # noqa: E402
import os  # noqa: E402

from flows.cli import main  # noqa: E402

code = main()
# Everything the run started is stopped and its exit handlers (Prefect's log and event
# drains, Ray's, logging's) run here; tearing down the thousands of modules the flow
# imported would only add a second and a half to every command (issue 19).
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
