"""Artifact writes sent from one background thread, so that no iteration waits on the
Prefect API for its own view.

Writes go out in submission order, each in the context it was submitted from; a write
under a key replaces a not-yet-started one under the same key (docs/architecture.md,
"What a user sees"). Best effort: a failed write is logged, and `flush` is where a flow
run waits for what it submitted.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable

from prefect.logging import get_logger

FLUSH_TIMEOUT_S = 60.0


class ArtifactWrites:
    def __init__(self) -> None:
        self._pending: OrderedDict[Hashable, tuple[contextvars.Context, Callable[[], Any]]] = OrderedDict()
        self._condition = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._unique = itertools.count()

    def submit(self, write: Callable[[], Any], key: Hashable | None = None) -> None:
        """Send `write` after everything submitted before it; with `key`, in place of
        a not-yet-started write under the same key (it keeps that one's turn)."""
        if key is None:
            key = ("unique", next(self._unique))
        with self._condition:
            self._pending[key] = (contextvars.copy_context(), write)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ppo-artifact-writes", daemon=True)
                self._thread.start()
            self._condition.notify_all()

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every submitted write has been sent (or has failed). False, with
        a warning, when they take longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    get_logger("ppo.artifacts").warning(
                        f"{len(self._pending)} artifact writes still unsent after {timeout_s:g} s; going on"
                    )
                    return False
                self._condition.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._pending:
                    self._condition.wait()
                _, (context, write) = self._pending.popitem(last=False)
                self._busy = True
            try:
                context.run(write)
            except Exception as error:  # each write is best effort; the record is on disk
                get_logger("ppo.artifacts").warning(f"artifact write failed: {type(error).__name__}: {error}")
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()


_writes = ArtifactWrites()


def artifact_writes() -> ArtifactWrites:
    """The writer of this process: one flow run at a time writes through it."""
    return _writes
