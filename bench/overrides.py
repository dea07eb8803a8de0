"""A benchmark's own arguments and the config overrides after a bare `--`, split the way
`python -m flows.ppo` splits them."""

from __future__ import annotations

import sys


def split_overrides(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(the benchmark's arguments, the overrides); `argv` None reads the command line."""
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        return list(argv), []
    split = argv.index("--")
    return argv[:split], argv[split + 1:]
