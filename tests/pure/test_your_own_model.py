"""A user's own model folder and data, checked at pre-flight (issue 46, S-BYO-1, S-BYO-2):
the packer fits the tokenizer, and each mistake a user makes with a folder of their own
is named with the folder and the fix, before anything starts."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from cli.manifest import check_manifest, validate_manifest
from configs.loading import load_config
from tests.conftest import TINY_PROFILE


def _rows(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _overrides(tmp_path, model, data: str, *extra: str) -> list[str]:
    return [
        f"job.output_root={tmp_path / 'outputs'}", f"model.path={model}", "model.tiny=null", f"rl.data.path={data}",
        "rl.data.prompt_key=question", "rl.data.reference_key=answer", "rl.validation=null", *extra,
    ]


def _questions(tmp_path, count: int = 60) -> str:
    rows = [{"question": f"{i} plus 1?", "answer": str(i + 1)} for i in range(count)]
    return _rows(tmp_path / "questions.jsonl", rows)


def _report(tmp_path, model, data=None, *extra):
    return check_manifest(load_config(TINY_PROFILE, _overrides(tmp_path, model, data or _questions(tmp_path), *extra)))


def test_a_gpt2_without_a_chat_template_gets_the_prompt_text_as_it_is(tmp_path, user_models):
    report = _report(tmp_path, user_models.plain)
    assert report.ok, report.problems
    summary = "\n".join(report.summary)
    # GPT-2's own size names (n_layer, n_embd, n_head), not "? layers".
    assert f"model: {user_models.plain} (GPT2LMHeadModel; 1 layers, hidden 16, heads 2/2)" in summary
    assert "packer: plain text (the tokenizer has no chat template" in summary
    assert "data_rows: 60" in summary  # the question/answer columns, every row read
    assert any("no pad_token: its eos_token '<|endoftext|>' pads prompts" in note for note in report.notes)


def test_a_tokenizer_with_a_chat_template_gets_it(tmp_path, user_models):
    report = _report(tmp_path, user_models.chat)
    assert report.ok and report.packer == "chat template (the tokenizer's chat_template.jinja)"
    forced = _report(tmp_path, user_models.chat, None, "data_packer.factory=data.packing:plain_text_packer")
    assert forced.ok and forced.packer == "data.packing:plain_text_packer (data_packer.factory)"


def test_a_conversation_for_a_model_without_a_template_is_refused_naming_the_key_and_the_fix(tmp_path, user_models):
    rows = [{"question": "1 plus 1?", "answer": "2"}] * 3 + [
        {"question": [{"role": "user", "content": "2 plus 2?"}], "answer": "4"}
    ]
    data = _rows(tmp_path / "chat.jsonl", rows)
    (problem,) = _report(tmp_path, user_models.plain, data).problems
    assert problem.key == "rl.data.prompt_key"
    assert str(problem).startswith(f"rl.data.prompt_key: {data} row 3 (line 4, column 1): question is a conversation")
    assert "has no chat template" in problem.message and "data_packer.factory" in problem.message
    assert _report(tmp_path, user_models.chat, data).ok  # the same rows suit a model with a template


def test_a_folder_without_tokenizer_files_is_refused_although_transformers_would_load_it(tmp_path, user_models):
    (problem,) = _report(tmp_path, user_models.no_tokenizer).problems
    assert problem.key == "model.path" and str(user_models.no_tokenizer) in problem.message
    assert "has no tokenizer files" in problem.message and "tokenizer.save_pretrained(folder)" in problem.message


def _copy(source, target, edit_file: str, edit) -> str:
    shutil.copytree(source, target)
    path = target / edit_file
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return str(target)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path, user_models):
    small = _copy(user_models.plain, tmp_path / "small", "config.json", lambda c: {**c, "vocab_size": 200})
    (problem,) = _report(tmp_path, small).problems
    assert "the tokenizer has 300 tokens but the model's embedding has 200 rows" in problem.message
    assert "resize_token_embeddings" in problem.message


def test_a_tokenizer_with_neither_eos_nor_pad_is_refused(tmp_path, user_models):
    def strip(settings):
        return {key: value for key, value in settings.items() if key not in ("eos_token", "pad_token")}

    bare = _copy(user_models.plain, tmp_path / "bare", "tokenizer_config.json", strip)
    (problem,) = _report(tmp_path, bare).problems
    assert problem.key == "model.path" and "neither eos_token nor pad_token" in problem.message


def test_a_folder_that_is_not_a_causal_lm_or_has_no_weights_is_refused(tmp_path, user_models):
    encoder = _copy(user_models.plain, tmp_path / "enc", "config.json",
                    lambda c: {**c, "architectures": ["GPT2ForSequenceClassification"]})
    (problem,) = _report(tmp_path, encoder).problems
    assert "not a causal language model" in problem.message
    (tmp_path / "enc" / "model.safetensors").unlink()
    assert [p.message for p in _report(tmp_path, encoder).problems][1].endswith("model.save_pretrained(folder)")


def test_the_manifest_prints_the_packer_and_takes_about_a_second(tmp_path, user_models):
    out, err = io.StringIO(), io.StringIO()
    assert validate_manifest(TINY_PROFILE, _overrides(tmp_path, user_models.plain, _questions(tmp_path)),
                             out=out, err=err) == 0, err.getvalue()
    assert "packer: plain text" in out.getvalue() and out.getvalue().rstrip().endswith("bind_check: ok")


@pytest.mark.parametrize("bad", ["no_tokenizer"])
def test_the_launch_preflight_refuses_what_the_manifest_refuses(tmp_path, user_models, bad):
    from configs.loading import ConfigError
    from rundir.preflight_checks import require_runnable

    config = load_config(TINY_PROFILE, _overrides(tmp_path, getattr(user_models, bad), _questions(tmp_path)))
    with pytest.raises(ConfigError) as refused:
        require_runnable(config)
    assert refused.value.problems == [str(p) for p in check_manifest(config).problems]


def test_the_manifest_refuses_a_run_that_is_running_as_the_launch_would(tmp_path, user_models):
    from rundir.run_lock import RunLock

    config = load_config(TINY_PROFILE, _overrides(tmp_path, user_models.plain, _questions(tmp_path)))
    with RunLock(tmp_path / "outputs" / config.job.name):  # this process holds it: a live run
        (problem,) = check_manifest(config).problems
    assert problem.key == "job.name" and "is being written by a running run" in problem.message
    assert check_manifest(config).ok  # released
