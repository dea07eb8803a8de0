"""Conversation rows checked at pre-flight (issue 59 item 2, S-BYO-4): a role outside
system/user/assistant/tool is refused naming the row, the key path and the role; each
distinct role sequence is rendered once through the chat template, and a template's
refusal names the row; the packer's refusal at run time repeats on a rerun."""

from __future__ import annotations

import json
import shutil

import pytest

import rundir.run_checks as run_checks
from cli.manifest import check_manifest
from configs.loading import load_config
from contracts.faults import repeats_on_rerun
from data.chat_render import TemplateRenderError, first_rows_by_roles, render_each_sequence
from tests.conftest import TINY_PROFILE

# Qwen2.5's own refusals, written small: a system turn only first, and three roles only.
STRICT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Only system, user and assistant roles are supported!') }}{% endif %}"
    "{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

SYSTEM, USER, ASSISTANT = (
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 plus 1?"},
    {"role": "assistant", "content": "2"},
)


def _rows(path, prompts) -> str:
    path.write_text("".join(json.dumps({"messages": prompt, "answer": "2"}) + "\n" for prompt in prompts))
    return str(path)


def _report(tmp_path, model, data, *extra):
    overrides = [
        f"job.output_root={tmp_path / 'outputs'}", f"model.path={model}", f"rl.data.path={data}",
        "rl.data.prompt_key=messages", "rl.data.reference_key=answer", "rl.validation=null", *extra,
    ]
    if model != "tiny":
        overrides.append("model.tiny=null")
    else:
        overrides[1] = f"model.path={tmp_path / 'tiny-model'}"  # built at start-up: not on disk now
    return check_manifest(load_config(TINY_PROFILE, overrides))


@pytest.fixture(scope="module")
def strict_model(user_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("strict") / "gpt2-strict"
    shutil.copytree(user_models.chat, folder)
    (folder / "chat_template.jinja").write_text(STRICT_TEMPLATE)
    return folder


def test_a_misspelt_role_is_refused_naming_the_row_the_key_path_and_the_role(tmp_path):
    data = _rows(tmp_path / "chat.jsonl", [[USER], [USER], [SYSTEM, {"role": "asistant", "content": "2"}]])
    report = _report(tmp_path, "tiny", data)
    (problem,) = report.problems
    assert problem.key == "rl.data.path"
    assert problem.message == (
        f"{data} row 2 (line 3, column 1): `messages[1].role` is 'asistant'; "
        "accepted: a role among system, user, assistant, tool"
    )


def test_a_template_that_refuses_a_role_sequence_is_refused_naming_the_row_and_the_role(tmp_path, strict_model):
    prompts = [[SYSTEM, USER], [SYSTEM, USER], [USER, {"role": "system", "content": "late"}, USER]]
    data = _rows(tmp_path / "chat.jsonl", prompts)
    (problem,) = _report(tmp_path, strict_model, data).problems
    assert problem.key == "rl.data.path"
    assert problem.message.startswith(
        f"{data} row 2 (line 3, column 1): the policy's chat template ({strict_model}) cannot render "
        "`messages[1].role` 'system' (roles user, system, user): TemplateError: System message must be at the "
        "beginning."
    )
    assert problem.message.endswith("edit the row, or use a model whose template accepts that role")


def test_a_tool_turn_the_template_cannot_render_is_refused_at_pre_flight_not_after_ray(tmp_path, strict_model):
    data = _rows(tmp_path / "chat.jsonl", [[USER, ASSISTANT, {"role": "tool", "content": "4"}]])
    (problem,) = _report(tmp_path, strict_model, data).problems
    assert "row 0 (line 1, column 1)" in problem.message and "`messages[2].role` 'tool'" in problem.message
    assert "Only system, user and assistant roles are supported!" in problem.message


def test_each_distinct_role_sequence_is_rendered_once(tmp_path, strict_model, monkeypatch):
    rendered = []
    real = run_checks.render_prompt

    def counting(tokenizer, conversation):
        rendered.append(tuple(message["role"] for message in conversation))
        return real(tokenizer, conversation)

    monkeypatch.setattr(run_checks, "render_prompt", counting)
    prompts = [[USER]] * 40 + [[SYSTEM, USER]] * 30 + [[SYSTEM, USER, ASSISTANT, USER]] * 30
    report = _report(tmp_path, strict_model, _rows(tmp_path / "chat.jsonl", prompts))
    assert report.ok, report.problems
    # 100 rows, three sequences: three renders, whatever the data's size.
    assert sorted(rendered) == sorted([("user",), ("system", "user"), ("system", "user", "assistant", "user")])
    assert "conversations: 3 distinct role sequences, each rendered once through the policy's chat template" in (
        report.summary
    )


def test_a_valid_conversation_dataset_passes(tmp_path, user_models):
    prompts = [[SYSTEM, USER], [USER, ASSISTANT, USER], [USER, ASSISTANT, {"role": "tool", "content": "4"}]]
    report = _report(tmp_path, user_models.chat, _rows(tmp_path / "chat.jsonl", prompts))
    assert report.ok, report.problems
    assert "data_rows: 3" in report.summary


def test_a_tiny_model_built_at_start_up_is_not_rendered_and_the_summary_says_so(tmp_path):
    report = _report(tmp_path, "tiny", _rows(tmp_path / "chat.jsonl", [[SYSTEM, USER]]))
    assert report.ok, report.problems
    line = next(line for line in report.summary if line.startswith("conversations:"))
    assert "not rendered through the policy's" in line and "is built at start-up" in line


def test_render_each_sequence_renders_the_first_row_of_each_sequence_only():
    calls = []

    def render(conversation):
        calls.append(conversation)
        if conversation[-1]["role"] == "tool":
            raise ValueError("no tools here")
        return "text"

    prompts = [(f"row {i}", [USER] if i % 2 else [USER, ASSISTANT, {"role": "tool", "content": "x"}])
               for i in range(10)]
    first = first_rows_by_roles(prompts)
    calls.clear()
    (failure,) = render_each_sequence(render, first, prompt_key="messages", template="the template")
    assert failure.args[0].startswith("row 0: the template cannot render `messages[2].role` 'tool'")
    assert "ValueError: no tools here" in failure.args[0]
    # Two sequences rendered once each, then the refused one's prefixes to find the role (three).
    assert len(calls) == 2 + 3


def test_the_packer_names_the_row_and_a_rerun_would_repeat_it(strict_model):
    from data.packing import text_packer

    packer = text_packer(str(strict_model))
    with pytest.raises(TemplateRenderError) as caught:
        packer.pack_prompts([[USER], [USER, {"role": "system", "content": "late"}]], ["a.jsonl row 0", "a.jsonl row 7"])
    assert str(caught.value).startswith("a.jsonl row 7: the model's chat template cannot render `prompt[1].role`")
    assert repeats_on_rerun(caught.value)


def test_a_reward_model_whose_template_refuses_a_row_is_refused_naming_it(tmp_path, user_models, strict_model):
    # The policy's template takes a tool turn; the reward model's (strict) does not.
    data = _rows(tmp_path / "chat.jsonl", [[USER], [USER, ASSISTANT, {"role": "tool", "content": "4"}]])
    report = _report(tmp_path, user_models.chat, data, f"rl.reward.model.path={strict_model}")
    refused = [p for p in report.problems if p.key == "rl.data.path"]
    (problem,) = refused  # (the GPT-2 folder is refused as no classifier too, under rl.reward.model.path)
    assert problem.message.startswith(
        f"{data} row 1 (line 2, column 1): the reward model's chat template ({strict_model}) cannot render "
        "`messages[2].role` 'tool'"
    )


def test_the_reward_model_scorer_names_the_row_and_a_rerun_would_repeat_it(strict_model):
    from models.reward_model import RewardText

    scorer = RewardText(str(strict_model), 128)
    with pytest.raises(TemplateRenderError) as caught:
        scorer.render([USER, {"role": "system", "content": "late"}], "2", "row 5 (a.jsonl row 5)")
    assert str(caught.value).startswith("row 5 (a.jsonl row 5): the reward model's chat template")
    assert "`prompt[1].role` 'system'" in str(caught.value) and repeats_on_rerun(caught.value)


def test_a_reward_model_without_a_template_is_refused_for_conversation_rows(tmp_path, user_models):
    data = _rows(tmp_path / "chat.jsonl", [[SYSTEM, USER]])
    report = _report(tmp_path, user_models.chat, data, f"rl.reward.model.path={user_models.plain}")
    messages = [p.message for p in report.problems if p.key == "rl.reward.model.path"]
    assert any(m.startswith(f"{data} row 0 (line 1, column 1): messages is a conversation") and "no chat template" in m
               for m in messages), messages


def _validation_report(tmp_path, train, held_out, *extra):
    """The tiny profile with both sources files: rl.data and rl.validation.data (S-BYO-2)."""
    overrides = [
        f"job.output_root={tmp_path / 'outputs'}", f"model.path={tmp_path / 'tiny-model'}", f"rl.data.path={train}",
        "rl.data.prompt_key=messages", "rl.data.reference_key=answer", f"rl.validation.data.path={held_out}",
        "rl.validation.data.factory=null", "rl.validation.data.prompt_key=messages",
        "rl.validation.data.reference_key=answer", *extra,
    ]
    return check_manifest(load_config(TINY_PROFILE, overrides))


def test_the_held_out_rows_are_checked_at_pre_flight_as_the_training_rows_are(tmp_path):
    train = _rows(tmp_path / "train.jsonl", [[USER], [SYSTEM, USER]])
    held_out = _rows(tmp_path / "held_out.jsonl", [[USER], [USER], [SYSTEM, {"role": "usr", "content": "3?"}]])
    (problem,) = _validation_report(tmp_path, train, held_out).problems
    assert problem.key == "rl.validation.data.path"
    assert problem.message == (
        f"{held_out} row 2 (line 3, column 1): `messages[1].role` is 'usr'; "
        "accepted: a role among system, user, assistant, tool"
    )
    (tmp_path / "held_out.jsonl").write_text(json.dumps({"question": "3?", "answer": "3"}) + "\n")
    (missing,) = _validation_report(tmp_path, train, held_out).problems
    assert missing.key == "rl.validation.data.prompt_key" and "messages" in missing.message


def test_good_held_out_rows_are_counted_beside_the_training_rows(tmp_path):
    train = _rows(tmp_path / "train.jsonl", [[USER], [SYSTEM, USER]])
    held_out = _rows(tmp_path / "held_out.jsonl", [[USER], [USER], [USER]])
    report = _validation_report(tmp_path, train, held_out)
    assert report.ok, report.problems
    assert report.data_rows == 2 and "data_rows: 2" in report.summary and "validation rows: 3" in report.summary
    assert any(line.startswith(f"validation data: {held_out}, every row read") for line in report.summary)


def test_a_held_out_dataset_name_that_cannot_give_rows_is_refused_under_its_own_keys(tmp_path):
    train = _rows(tmp_path / "train.jsonl", [[USER]])
    overrides = [f"job.output_root={tmp_path / 'outputs'}", f"model.path={tmp_path / 'tiny-model'}",
                 f"rl.data.path={train}", "rl.data.prompt_key=messages", "rl.data.reference_key=answer",
                 "rl.validation.data.name=parquet", "rl.validation.data.factory=null"]
    (problem,) = check_manifest(load_config(TINY_PROFILE, overrides)).problems
    assert problem.key == "rl.validation.data.name"
    assert "rl.validation.data.path" in problem.message and "rl.data.path" not in problem.message
