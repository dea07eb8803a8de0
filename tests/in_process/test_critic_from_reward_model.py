"""S-RM-2: the critic may start from the reward model (`model.critic_path`): its value
at a sequence's last token is then the reward model's score of that sequence; a folder
whose vocabulary is not the policy's is refused by key, at pre-flight and in the role."""

from __future__ import annotations

import shutil

import pytest
import torch

from configs.loading import load_config
from models.critic_source import CriticSourceError
from models.reward_model import LocalScorer, RewardText, RowOrigin
from models.tiny_model import build_tokenizer
from roles.critic_role import CriticRole
from tests.conftest import TINY_PROFILE, first_rank


def _config(model_dir: str, critic_path: str):
    return load_config(TINY_PROFILE, [f"model.path={model_dir}", f"model.critic_path={critic_path}"])


def test_the_critics_first_values_are_the_reward_models_scores(tiny_model_dir, tiny_reward_model_dir):
    config = _config(tiny_model_dir, tiny_reward_model_dir)
    critic = CriticRole(config, first_rank(config, "critic"))
    scorer = LocalScorer(RewardText(tiny_reward_model_dir, 64), "float32", 4)
    texts = [scorer.text.render("3", "3"), scorer.text.render("4", "71")]
    ids = scorer.text.token_ids(texts, [RowOrigin(0, None), RowOrigin(1, None)])
    expected = scorer.score_ids(ids)
    with torch.no_grad():
        for row, sequence in enumerate(ids):
            logits = critic.runtime.model(input_ids=torch.tensor([sequence])).logits  # (1, s, 1): a value per token
            assert float(logits[0, -1, 0]) == pytest.approx(float(expected[row]), abs=1e-5)


def test_a_critic_source_with_another_vocabulary_is_refused_by_key(tiny_model_dir, tiny_reward_model_dir, tmp_path):
    other = tmp_path / "other-vocabulary"
    shutil.copytree(tiny_reward_model_dir, other)
    build_tokenizer("abcdefghij").save_pretrained(other)
    config = _config(tiny_model_dir, str(other))
    with pytest.raises(CriticSourceError, match=r"^model.critic_path: .*vocabulary differs from the policy's"):
        CriticRole(config, first_rank(config, "critic"))

    from rundir.preflight_checks import check_manifest

    report = check_manifest(config)
    assert [p.key for p in report.problems] == ["model.critic_path"]
    assert "first difference" in str(report.problems[0])
    assert any(line.startswith("critic: starts from") for line in check_manifest(
        _config(tiny_model_dir, tiny_reward_model_dir)).summary)
