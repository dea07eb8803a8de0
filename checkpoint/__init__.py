"""Checkpoint boundaries: role saves, verification, the `_SUCCESS` marker and the
latest pointer. No Ray, no Prefect: the commit task calls into this."""
