"""S-RM-1: the reward role scoring with a learned reward model: its own chat template,
the logit at the last token, the one combination rule, and the errors that name what
to fix (a folder that is no one-label classifier, a text that would be truncated, a
NaN score)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from configs.loading import load_config
from contracts.trajectory import PromptBatch, Trajectory
from models.reward_model import RewardModelError
from roles.reward_role import RewardRole
from tests.conftest import TINY_PROFILE

EOS = 1  # the tiny tokenizer's <|im_end|> (models/tiny_model.py SPECIAL_TOKENS)


def _generated(prompts: list[str], completions: list[str], references: list[str],
               ended: list[bool] | None = None) -> Trajectory:
    b = len(completions)
    response_ids = torch.full((b, 2), 5, dtype=torch.long)
    response_mask = torch.ones(b, 2)
    for row, stop in enumerate(ended or [False] * b):
        if stop:
            response_ids[row, 1] = EOS
    sources = [f"f.jsonl:{i + 1}" for i in range(b)]
    batch = PromptBatch(1, prompts, references, [{}] * b, list(range(10, 10 + b)), sources)
    return Trajectory.one_turn(
        iteration=1, policy_version=0, prompts=batch,
        prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.long),
        response_ids=response_ids, response_mask=response_mask, rollout_logprobs=torch.zeros(b, 2),
        completions=completions,
    )


def _role(reward_model: str, *overrides: str, model_dir: str | None = None) -> RewardRole:
    extra = [f"model.path={model_dir}"] if model_dir else []
    return RewardRole(load_config(TINY_PROFILE, [f"rl.reward.model.path={reward_model}", *extra, *overrides]))


def _direct_score(folder: str, text: str) -> float:
    """The classifier's logit for one unpadded text, through transformers alone."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return float(model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0])


def test_the_score_is_the_models_logit_on_its_own_rendering(tiny_reward_model_dir):
    role = _role(tiny_reward_model_dir, "rl.reward.terminal=none")
    # Completions of different lengths: the batch is padded, each score must not see it.
    trajectory = _generated(["3", "3", "3"], ["3", "57", ""], ["3", "3", "3"])
    scored, metrics = role.score(trajectory)
    rendered = [f"<|im_start|>user\n3<|im_end|>\n<|im_start|>assistant\n{c}<|im_end|>\n" for c in ("3", "57", "")]
    assert role.model_term.text.render("3", "57") == rendered[1]  # the reward model's own chat template
    expected = [_direct_score(tiny_reward_model_dir, text) for text in rendered]
    assert scored.sequence_scores.tolist() == pytest.approx(expected, abs=1e-5)
    assert metrics["reward/model_raw_mean"] == pytest.approx(sum(expected) / 3, abs=1e-5)
    assert metrics["train/reward_mean"] == pytest.approx(sum(expected) / 3, abs=1e-5)


def test_sum_adds_the_rules_reward_and_model_only_measures_it(tiny_reward_model_dir):
    trajectory = _generated(["3", "4"], ["3", "5"], ["3", "4"])
    alone, alone_metrics = _role(tiny_reward_model_dir, "rl.reward.terminal=exact_match").score(trajectory)
    raw = alone.sequence_scores
    assert alone_metrics["reward/fraction_correct"] == 0.5  # measured, never added
    summed, _ = _role(
        tiny_reward_model_dir, "rl.reward.terminal=exact_match", "rl.reward.model.combine=sum",
        "rl.reward.model.weight=2.0", "rl.reward.correct_reward=3.0",
    ).score(trajectory)
    # 2 x score + (3 for the copied digit, 0 for the wrong one)
    assert summed.sequence_scores.tolist() == pytest.approx((2 * raw + torch.tensor([3.0, 0.0])).tolist(), abs=1e-5)


def test_shaping_counts_clips_and_penalises_and_evaluation_leaves_the_statistics(tiny_reward_model_dir,
                                                                                 tiny_model_dir):
    role = _role(
        tiny_reward_model_dir, "rl.reward.terminal=none", "rl.reward.model.normalize=true",
        "rl.reward.model.clip=0.5", "rl.reward.model.missing_eos_penalty=2.0", model_dir=tiny_model_dir,
    )
    trajectory = _generated(["1", "2", "3", "4"], ["1", "9", "3", "0"], ["1", "2", "3", "4"],
                            ended=[True, False, True, True])
    role.score_validation(trajectory)
    assert role.model_term.moments.count == 0  # S-OPS-2: evaluation never moves training's statistics
    scored, metrics = role.score(trajectory)
    assert role.model_term.moments.count == 4
    # Normalised over these four, clipped to ±0.5, then 2.0 off the one without EOS.
    assert scored.sequence_scores.max() <= 0.5 and scored.sequence_scores[1] <= -1.5
    assert metrics["reward/model_penalized_fraction"] == 0.25
    assert 0.0 < metrics["reward/model_clipped_fraction"] <= 1.0
    assert abs(metrics["reward/model_normalized_mean"]) < 1e-6


def test_a_folder_that_is_not_a_one_label_classifier_is_refused_by_key(tiny_model_dir, tiny_reward_model_dir,
                                                                       tmp_path):
    with pytest.raises(RewardModelError, match=r"rl.reward.model.path: .*Qwen3ForCausalLM, not a sequence classifier"):
        _role(tiny_model_dir)
    two_labels = tmp_path / "two-labels"
    shutil.copytree(tiny_reward_model_dir, two_labels)
    config = (two_labels / "config.json").read_text()
    (two_labels / "config.json").write_text(config.replace('"LABEL_0"\n', '"LABEL_0",\n    "1": "LABEL_1"\n', 1))
    with pytest.raises(RewardModelError, match="sequence classifier with 2 labels"):
        _role(str(two_labels))


def test_a_text_longer_than_max_length_fails_naming_its_row(tiny_reward_model_dir):
    role = _role(tiny_reward_model_dir, "rl.reward.terminal=none", "rl.reward.model.max_length=30")
    trajectory = _generated(["1", "1234567890"], ["1", "2"], ["1", "1"])
    with pytest.raises(RewardModelError) as caught:
        role.score(trajectory)
    message = str(caught.value)
    # <|im_start|> user \n 1234567890 <|im_end|> \n <|im_start|> assistant \n 2 <|im_end|> \n, one token a
    # character or special: 1 + 4 + 1 + 10 + 1 + 1 + 1 + 9 + 1 + 1 + 1 + 1 = 32; row 0 (22 tokens) fits.
    assert message.startswith("row 11 (f.jsonl:2): the prompt and completion are 32 tokens")
    assert "rl.reward.model.max_length=30" in message


def test_a_nan_score_fails_naming_the_row(tiny_reward_model_dir, tmp_path):
    broken = tmp_path / "nan-head"
    shutil.copytree(tiny_reward_model_dir, broken)
    weights = load_file(broken / "model.safetensors")
    weights["score.weight"] = torch.full_like(weights["score.weight"], float("nan"))
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    role = _role(str(broken), "rl.reward.terminal=none")
    with pytest.raises(RewardModelError, match=r"scored row 10 \(f.jsonl:1\) as nan, completion '7'"):
        role.score(_generated(["7"], ["7"], ["7"]))


def test_the_tiny_reward_model_folder_is_fingerprinted_without_its_build_report(tiny_reward_model_dir):
    from models.fingerprint import fingerprint_folder

    files = fingerprint_folder(Path(tiny_reward_model_dir)).files
    assert "model.safetensors" in files and "tiny_reward_training.json" not in files
