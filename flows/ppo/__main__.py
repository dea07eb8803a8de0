"""`python -m flows.ppo --config FILE [--validate-manifest] [--fresh] [-- key=value ...]`."""

import sys

from flows.environment import apply_default_environment

apply_default_environment()  # before Prefect is imported

from flows.cli import main  # noqa: E402

sys.exit(main())
