"""The keys a run's Prefect artifacts are stored under, shared by the iteration (its
samples table) and the history views, without importing Prefect."""

from __future__ import annotations

import hashlib
import re


def artifact_key(run_name: str, kind: str) -> str:
    """`ppo-<run>-<kind>` in the alphabet Prefect accepts for keys (lowercase letters,
    digits, dashes). A name that had to change gets a short hash of the original, so
    `My_Run` and `my-run` never share (and overwrite) one history."""
    slug = re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-") or "run"
    if slug != run_name:
        slug = f"{slug}-{hashlib.sha1(run_name.encode()).hexdigest()[:6]}"
    return f"ppo-{slug}-{kind}"
