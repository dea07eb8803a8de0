"""Which installed versions a compat module's internals were written against."""

from __future__ import annotations

import functools
import sys
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@functools.cache
def installed_version(distribution: str) -> Version | None:
    try:
        return Version(version(distribution))
    except PackageNotFoundError:
        return None


@functools.cache
def _said(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def within(distribution: str, written_for: SpecifierSet, what: str, public_path: str) -> bool:
    """True when `distribution`'s installed version is inside `written_for`; outside
    it, one line (once per process) says which public path is taken instead."""
    found = installed_version(distribution)
    if found is not None and written_for.contains(found, prereleases=True):
        return True
    _said(
        f"{distribution} {found or 'not installed'}: {what} was written for {distribution}{written_for}; "
        f"{public_path} instead"
    )
    return False
