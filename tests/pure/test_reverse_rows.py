"""The reversal task's rows (configs/ppo_tiny_reverse_cpu.py): the reference is the
prompt's digits reversed, and no held-out string is ever trained on, by PPO or by the
tiny model's pre-training."""

import pytest

from configs.loading import ConfigError, load_config
from data.synthetic import REVERSE_PROMPT, heldout_reversals, reverse_digits_split
from models.tiny_pretrain import pretrain_rows
from tests.conftest import REPO_ROOT

REVERSE_PROFILE = str(REPO_ROOT / "configs" / "ppo_tiny_reverse_cpu.py")


def digits_of(row: dict) -> str:
    assert row["prompt"].startswith(REVERSE_PROMPT)
    return row["prompt"][len(REVERSE_PROMPT) :]


def test_the_reference_is_the_digits_reversed_within_the_length_range():
    rows = list(reverse_digits_split(500, seed=3, min_digits=8, max_digits=20))
    assert all(row["reference"] == digits_of(row)[::-1] for row in rows)
    lengths = {len(digits_of(row)) for row in rows}
    assert min(lengths) == 8 and max(lengths) == 20


def test_training_and_heldout_strings_never_meet():
    heldout = {digits_of(row) for row in heldout_reversals(256, max_digits=20)}
    trained = {digits_of(row) for row in reverse_digits_split(3000, seed=0, max_digits=20)}
    # What pre-training is actually fed, not just the split it draws from.
    pretrained = {
        digits_of(row) for row in pretrain_rows("reverse", 3000, 0, 99, 8, 20, period_fraction=0.6)
    }
    assert len(heldout) == 256 and not heldout & trained and not heldout & pretrained
    assert heldout_reversals(256, max_digits=20) == heldout_reversals(256, max_digits=20)  # a fixed set


def test_the_period_habit_is_a_seeded_share_of_the_pretraining_answers():
    rows = pretrain_rows("reverse", 2000, 0, 99, 8, 20, period_fraction=0.6)
    habit = [row["reference"].endswith(".") for row in rows]
    assert 0.55 < sum(habit) / len(rows) < 0.65
    assert all(row["reference"].rstrip(".") == digits_of(row)[::-1] for row in rows)
    assert rows == pretrain_rows("reverse", 2000, 0, 99, 8, 20, period_fraction=0.6)
    assert not any(row["reference"].endswith(".") for row in pretrain_rows("reverse", 200, 0, 99))


def test_the_profile_loads_and_its_alphabet_must_hold_the_period():
    config = load_config(REVERSE_PROFILE, [])
    assert config.rl.reward.terminal == "exact_match" and config.rl.rollout.max_new_tokens == 21
    with pytest.raises(ConfigError, match="task_alphabet lacks '.'"):
        load_config(REVERSE_PROFILE, ["model.tiny.task_alphabet=0123456789reverse "])
