"""The background artifact writer (views/artifact_writes.py, issue 19): the history and
samples tables a user reads in the UI are sent from a thread, so they must still
arrive complete, in order, in the right context, and newest-wins only where asked."""

from __future__ import annotations

import contextvars
import threading

from views.artifact_writes import ArtifactWrites

WHERE: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="nowhere")


def test_writes_arrive_in_order_each_in_the_context_it_was_submitted_from():
    writes = ArtifactWrites()
    sent: list[tuple[int, str]] = []
    for index in range(20):
        WHERE.set(f"run {index}")
        writes.submit(lambda index=index: sent.append((index, WHERE.get())))
    assert writes.flush(timeout_s=30)
    assert sent == [(index, f"run {index}") for index in range(20)]


def test_an_unsent_write_is_replaced_by_a_newer_one_under_its_key_and_keeps_its_turn():
    writes = ArtifactWrites()
    release = threading.Event()
    sent: list[str] = []
    writes.submit(release.wait)  # holds the thread while the rest queue up
    writes.submit(lambda: sent.append("table v1"), key="table")
    writes.submit(lambda: sent.append("samples 1"))
    writes.submit(lambda: sent.append("table v2"), key="table")
    writes.submit(lambda: sent.append("samples 2"))
    release.set()
    assert writes.flush(timeout_s=30)
    assert sent == ["table v2", "samples 1", "samples 2"]  # unkeyed writes never coalesce


def test_a_failing_write_is_logged_and_the_next_ones_still_go_out(caplog):
    writes = ArtifactWrites()
    sent: list[int] = []

    def refused() -> None:
        raise RuntimeError("409 Conflict")

    writes.submit(refused)
    writes.submit(lambda: sent.append(1))
    assert writes.flush(timeout_s=30)
    assert sent == [1]
    assert "artifact write failed: RuntimeError: 409 Conflict" in caplog.text


def test_flush_gives_up_after_its_timeout_instead_of_hanging(caplog):
    writes = ArtifactWrites()
    release = threading.Event()
    writes.submit(release.wait)
    writes.submit(lambda: None)
    try:
        assert writes.flush(timeout_s=0.2) is False
        assert "artifact writes still unsent after 0.2 s" in caplog.text
    finally:
        release.set()
    assert writes.flush(timeout_s=30)
