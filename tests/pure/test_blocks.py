"""Blocks of iterations (flows/blocks.py, S-OPS-1): aligned windows of
`job.iterations_per_block`, the first one starting where the run (re)starts."""

import pytest
from pydantic import ValidationError

from configs.schema import JobConfig
from flows.blocks import block_name, iteration_blocks


def test_a_fresh_run_is_cut_into_aligned_blocks_and_the_last_one_is_short():
    # 1..120 by 50: two whole blocks, then 101..120.
    assert iteration_blocks(1, 120, 50) == [(1, 50), (51, 100), (101, 120)]
    assert iteration_blocks(1, 3, 2) == [(1, 2), (3, 3)]
    assert iteration_blocks(1, 5, 1) == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]


def test_a_resumed_run_starts_its_first_block_at_the_resume_iteration():
    # Resuming after boundary 36: the rest of window 1..50, then the windows as before.
    assert iteration_blocks(37, 120, 50) == [(37, 50), (51, 100), (101, 120)]
    assert iteration_blocks(51, 100, 50) == [(51, 100)]  # resuming on a window's edge
    assert iteration_blocks(50, 51, 50) == [(50, 50), (51, 51)]


def test_a_run_with_nothing_left_has_no_block_and_a_block_never_spans_two_windows():
    assert iteration_blocks(21, 20, 50) == []
    for start in range(1, 30):
        blocks = iteration_blocks(start, 95, 7)
        assert [i for first, last in blocks for i in range(first, last + 1)] == list(range(start, 96))
        assert all((first - 1) // 7 == (last - 1) // 7 for first, last in blocks)


def test_block_names_read_as_the_iterations_they_hold():
    assert block_name(1, 50) == "iterations 1-50"
    assert block_name(101, 101) == "iteration 101"


def test_the_block_size_is_bounded_with_an_error_naming_the_key():
    assert JobConfig().iterations_per_block == 50
    for wrong in (0, 201):
        with pytest.raises(ValidationError, match=r"job\.iterations_per_block: .* outside 1\.\.200"):
            JobConfig(iterations_per_block=wrong)
