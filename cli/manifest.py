"""`--validate-manifest`: the run's pre-flight (rundir/preflight_checks.py), printed (S-RUN-3).

A summary and `bind_check: ok` (exit 0), or every problem with its key path. It never
starts or imports Ray, loads weights or downloads; docs/launch.md section 1 lists the
checks.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from configs.loading import ConfigError, load_config
from rundir.preflight_checks import check_manifest
from rundir.run_checks import ManifestReport, describe_transport

__all__ = ["ManifestReport", "check_manifest", "describe_transport", "validate_manifest"]

EXIT_OK = 0
EXIT_PROBLEMS = 1  # the manifest names problems
EXIT_CONFIG = 2  # the config itself does not type-check (same code as the CLI's)


def validate_manifest(
    profile: str, overrides: list[str], *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """The CLI's `--validate-manifest`: prints a short summary and `bind_check: ok`
    (exit 0), or every problem with its key path (exit non-zero)."""
    out = out or sys.stdout
    err = err or sys.stderr
    started = time.perf_counter()
    try:
        config = load_config(profile, overrides)
    except ConfigError as error:
        for problem in error.problems:
            print(f"error: {problem}", file=err)
        print(f"bind_check: failed ({len(error.problems)} config problem(s))", file=out)
        return EXIT_CONFIG
    report = check_manifest(config, profile=profile)
    print(f"profile: {profile}", file=out)
    for line in report.summary:
        print(line, file=out)
    for note in report.notes:
        print(f"note: {note}", file=out)
    elapsed = time.perf_counter() - started
    out.flush()
    if report.problems:
        for problem in report.problems:
            print(f"error: {problem}", file=err)
        print(f"bind_check: failed ({len(report.problems)} problem(s), checked in {elapsed:.2f} s)", file=out)
        return EXIT_PROBLEMS
    print(f"checked in {elapsed:.2f} s; no worker started, no weights loaded", file=out)
    print("bind_check: ok", file=out)
    return EXIT_OK


if __name__ == "__main__":
    # `python -m cli.manifest --config FILE [-- key=value ...]`: the same check as
    # `python -m flows.ppo --validate-manifest`, without importing the flow module
    # (whose Prefect, Ray and torch imports cost seconds before the check starts).
    from cli.arguments import parse_args, warmup_override

    arguments, extra = parse_args(sys.argv[1:], prog="python -m cli.manifest")
    sys.exit(validate_manifest(arguments.config, extra + warmup_override(arguments)))
