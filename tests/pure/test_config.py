"""Config profiles, overrides and the errors users see (S-RUN-2)."""

import subprocess
import sys

import pytest

from configs.loading import ConfigError, load_config, load_profile
from tests.conftest import REPO_ROOT, TINY_PROFILE

PUBLIC_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")


def test_both_profiles_load_and_type_check():
    tiny = load_profile(TINY_PROFILE)
    public = load_profile(PUBLIC_PROFILE)
    assert tiny.model.tiny is not None and tiny.rl.rollout.engine == "hf"
    assert public.model.path == "Qwen/Qwen3-0.6B" and public.rl.rollout.engine == "vllm"
    assert public.rl.max_steps == 1000
    assert (
        public.grid.gpu_placement, public.grid.policy_gpus, public.grid.reference_gpus, public.grid.critic_gpus
    ) == ("colocated", 2, 1, 1)


def test_overrides_apply_with_json_values():
    config = load_config(
        TINY_PROFILE, ["rl.max_steps=5", "job.name=try1", "rl.kl_coef=0.5", "rl.whiten_advantages=false"]
    )
    assert (config.rl.max_steps, config.job.name, config.rl.kl_coef, config.rl.whiten_advantages) == (
        5, "try1", 0.5, False
    )


@pytest.mark.parametrize(
    "override, key",
    [
        ("rl.max_stepz=5", "rl.max_stepz"),
        ("rl.max_steps=abc", "rl.max_steps"),
        ("rl.critic_warmup_iterations=-1", "rl.critic_warmup_iterations"),
        ("rl.critic_warmup_iterations=1.5", "rl.critic_warmup_iterations"),
        ("model.tiny.hidden_size=big", "model.tiny.hidden_size"),
        ("rl.rollout.engine=tgi", "rl.rollout.engine"),
        ("nope.key=1", "nope.key"),
    ],
)
def test_bad_override_names_its_dotted_key(override, key):
    with pytest.raises(ConfigError) as caught:
        load_config(TINY_PROFILE, [override])
    assert any(problem.startswith(key) for problem in caught.value.problems), caught.value.problems


def test_every_problem_is_reported_not_just_the_first():
    with pytest.raises(ConfigError) as caught:
        load_config(TINY_PROFILE, ["rl.max_steps=0", "rl.batch_size=x"])
    assert len(caught.value.problems) == 2


def test_choosing_a_data_source_on_the_command_line_replaces_the_profiles():
    config = load_config(TINY_PROFILE, ["rl.data.path=prompts.jsonl"])
    assert config.rl.data.path == "prompts.jsonl" and config.rl.data.factory is None


def test_cli_exits_non_zero_naming_the_key():
    result = subprocess.run(
        [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", "rl.max_stepz=5"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "rl.max_stepz" in result.stderr


def test_missing_profile_is_a_clear_error():
    with pytest.raises(ConfigError, match="no such file 'configs/nope.py'"):
        load_profile("configs/nope.py")


def test_config_reference_doc_is_generated_from_the_schema():
    from configs.reference_doc import render

    committed = (REPO_ROOT / "docs" / "reference" / "config.md").read_text()
    assert committed == render(), "run: python -m configs.reference_doc > docs/reference/config.md"
