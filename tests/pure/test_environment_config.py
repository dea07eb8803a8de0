"""The edges of the environment seam a user meets first (S-ENV-1, S-ENV-3): config that
is refused by key, templates that cannot carry tool messages, malformed answers, and
episode seeds that do not depend on which engine generated a shard."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from configs.loading import ConfigError, load_config
from environments.chat_tokens import TemplateError
from environments.factory import episode_seeds
from environments.preflight import template_renders_tool_messages
from environments.protocol import MalformedEnvironmentOutput, Reset, Step, checked_reset, checked_step
from models.tiny_model import CHAT_TEMPLATE, build_tokenizer
from tests.conftest import TINY_PROFILE

ENV = "rl.env.factory=data.synthetic:addition_split"


def _problems(*overrides: str) -> str:
    with pytest.raises((ConfigError, ValidationError)) as caught:
        load_config(TINY_PROFILE, list(overrides))
    return str(caught.value)


def test_a_second_reward_source_and_a_turn_longer_than_its_episode_are_refused_by_key():
    assert "rl.reward.process: per-token shaping is not applied" in _problems(ENV, "rl.reward.process=linear")
    assert "rl.env.max_turn_tokens (300) exceeds rl.env.max_episode_tokens (256)" in _problems(
        ENV, "rl.env.max_turn_tokens=300"
    )


def test_a_template_that_drops_tool_messages_is_refused_and_chatml_passes():
    tokenizer = build_tokenizer("0123456789")
    template_renders_tool_messages(tokenizer)  # the tiny ChatML template renders every role
    tokenizer.chat_template = CHAT_TEMPLATE.replace(
        "{% for message in messages %}", "{% for message in messages if message['role'] != 'tool' %}"
    )
    with pytest.raises(TemplateError, match="does not render messages of role 'tool'"):
        template_renders_tool_messages(tokenizer)


def test_pre_flight_names_rl_env_for_a_model_folder_whose_template_drops_tool_messages(tmp_path):
    from rundir.preflight import config_problems

    folder = tmp_path / "chat-model"
    tokenizer = build_tokenizer("0123456789")
    tokenizer.chat_template = CHAT_TEMPLATE.replace(
        "{% for message in messages %}", "{% for message in messages if message['role'] != 'tool' %}"
    )
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    config = load_config(TINY_PROFILE, [ENV, f"model.path={folder}"])
    problems = [str(problem) for problem in config_problems(config) if problem.key == "rl.env"]
    assert len(problems) == 1 and "does not render messages of role 'tool'" in problems[0], problems


@pytest.mark.parametrize("answer, message", [
    ("just text", "step returned str; return environments.protocol.Step"),
    (([{"role": "tool"}], 0.0, False), r"message 0 \(tool\) needs a string 'content'"),
    (([{"role": "robot", "content": "x"}], 0.0, False), "has role 'robot'"),
    (([{"role": "assistant", "content": "x"}], 0.0, False), "may not speak as the assistant"),
    (([], float("nan"), True), "reward must be a finite number"),
    (([], 1.0, "yes"), "done must be True or False"),
    (([], 0.0, False), "needs observation messages"),
])
def test_a_malformed_step_is_named(answer, message):
    with pytest.raises(MalformedEnvironmentOutput, match=message):
        checked_step(answer)


def test_reset_shorthands_are_accepted_and_an_empty_opening_refused():
    assert checked_reset([{"role": "user", "content": "hi"}]) == Reset([{"role": "user", "content": "hi"}])
    assert checked_reset(([{"role": "user", "content": "hi"}], [{"type": "function"}])).tools == [{"type": "function"}]
    assert checked_step(([{"role": "tool", "content": "4"}], 1, False)) == Step([{"role": "tool", "content": "4"}],
                                                                                 1.0, False)
    with pytest.raises(MalformedEnvironmentOutput, match="no messages"):
        checked_reset([])


def test_an_episode_seed_depends_on_the_row_and_its_place_in_the_batch_not_on_the_shard():
    whole = episode_seeds(3, 7, [10, 11, 12, 13], first_position=0, stream=0)
    halves = episode_seeds(3, 7, [10, 11], 0, 0) + episode_seeds(3, 7, [12, 13], 2, 0)
    assert whole == halves and len(set(whole)) == 4
    assert set(whole).isdisjoint(episode_seeds(3, 7, [10, 11, 12, 13], 0, stream=1))  # evaluation's own
    assert whole != episode_seeds(3, 8, [10, 11, 12, 13], 0, 0)  # a new draw every iteration
