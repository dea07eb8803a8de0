"""Which failures a rerun would repeat (S-BYO-3): those end on what to fix, the others
on the resume hint. An actor's constructor error often reaches the driver only as
text (Ray's "died in its creation task"), so the class is found by its name."""

from __future__ import annotations

from contracts.faults import repeats_on_rerun
from data.prompt_projection import PromptError
from processes.actors import startup_repeats


def test_user_data_repeats_and_a_lost_process_does_not():
    bad_row = PromptError("rows.jsonl row 3 (line 4, column 1)", "prompt", "is missing")
    assert repeats_on_rerun(bad_row) and startup_repeats(bad_row)
    assert not repeats_on_rerun(OSError("connection reset")) and not startup_repeats(OSError("connection reset"))
    try:
        try:
            raise bad_row
        except PromptError as error:
            raise RuntimeError("the data role could not start") from error
    except RuntimeError as wrapped:
        assert repeats_on_rerun(wrapped)  # through the chain


def test_a_constructor_error_known_only_by_its_text_is_classified_by_its_class_name():
    died = RuntimeError(
        "The actor died because of an error raised in its creation task, ray::DataRole.__init__()\n"
        "Traceback (most recent call last):\n"
        "data.prompt_projection.PromptError: rows.jsonl row 3 (line 4, column 1): prompt is missing"
    )
    assert startup_repeats(died)
    assert not startup_repeats(RuntimeError("The actor died unexpectedly\nOSError: out of memory"))
