"""S-SEC-3: a config value that names code, set by an override (the CLI after `--`, a
deployment's parameters, a flow parameter), names only trusted modules; nothing is
imported or called before that check, and the resolved object must be defined there."""

from __future__ import annotations

import sys

import pytest

from configs.callables import PROJECT_CALLABLE_MODULES, code_reference_keys, import_callable
from configs.loading import ConfigError, load_config
from configs.schema import PPOConfig

from tests.conftest import TINY_PROFILE, TRUSTING_TINY_PROFILE

CODE_KEYS = sorted(code_reference_keys(PPOConfig))


def test_the_schema_walk_finds_every_key_that_names_code():
    assert CODE_KEYS == sorted(
        ["rl.data.factory", "rl.validation.data.factory", "data_packer.factory", "rl.reward.terminal_callable",
         "rl.env.factory"]
    )


def _string_fields(model, prefix=""):
    from configs.callables import _section_of

    for name, info in model.model_fields.items():
        section = _section_of(info.annotation)
        if section is not None:
            yield from _string_fields(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info


def test_a_key_described_as_naming_code_must_be_typed_so():
    """A key added later that takes `package.module:callable` but is typed plain `str`
    would bypass the trust check: its description gives it away."""
    described = {key for key, info in _string_fields(PPOConfig) if "module:callable" in (info.description or "")}
    assert described == set(CODE_KEYS)


def _refusal(overrides: list[str], profile: str = TINY_PROFILE) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(profile, overrides)
    return caught.value.problems


@pytest.mark.parametrize("key", CODE_KEYS)
@pytest.mark.parametrize("value", ["os:system", "subprocess:run", "runpy:run_path", "builtins:exec"])
def test_an_override_naming_code_outside_the_trusted_modules_is_refused_by_key(key, value):
    extra = ["rl.validation.data.shuffle=false"] if key.startswith("rl.validation") else []
    (problem,) = _refusal([f"{key}={value}", *extra])
    module = value.partition(":")[0]
    assert problem.startswith(f"{key}: {value!r} names code in module {module!r}"), problem
    assert "job.trusted_modules" in problem  # how to trust it


def test_the_check_imports_nothing(tmp_path, monkeypatch):
    """Finding a dotted module imports its parent package, whose top-level code runs:
    the trust check comes first."""
    package = tmp_path / "planted_pkg"
    package.mkdir()
    marker = tmp_path / "ran.txt"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (package / "rows.py").write_text("def make():\n    return [{'prompt': '1', 'reference': '1'}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = _refusal(["rl.data.factory=planted_pkg.rows:make"])
    assert problems[0].startswith("rl.data.factory: 'planted_pkg.rows:make' names code")
    assert not marker.exists() and "planted_pkg" not in sys.modules


def test_the_trusted_list_and_whole_sections_cannot_be_overridden():
    (problem,) = _refusal(['job.trusted_modules=["os"]'])
    assert problem.startswith("job.trusted_modules: set only in the profile")
    problems = _refusal(['rl.reward={"terminal_callable": "os:system"}'])
    assert problems[0].startswith("rl.reward.terminal_callable: 'os:system' names code")


def test_trusted_values_are_still_accepted():
    # The project's own factories, by override.
    config = load_config(TINY_PROFILE, ["rl.data.factory=data.synthetic:each_digit", "rl.data.factory_kwargs={}"])
    assert config.rl.data.factory == "data.synthetic:each_digit"
    # A module the profile trusts, by override.
    config = load_config(TRUSTING_TINY_PROFILE, ["rl.reward.terminal_callable=tests.pure.test_rewards:says_hello"])
    assert config.rl.reward.terminal_callable == "tests.pure.test_rewards:says_hello"
    # Values written in the profile itself are the operator's: unchanged by other overrides.
    assert load_config(TINY_PROFILE, ["rl.max_steps=3"]).rl.data.factory == "data.synthetic:copy_digit"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("data.synthetic:random.seed", "reaches through module 'random'"),  # a trusted module's import
        ("data.synthetic:zlib.crc32", "reaches through module 'zlib'"),
        ("data.synthetic:Iterator", "outside the trusted modules"),  # re-exported from typing
    ],
)
def test_a_trusted_module_cannot_lend_out_what_it_imported(path, reason):
    with pytest.raises(ValueError, match=reason) as caught:
        import_callable(path, key="rl.data.factory")
    assert str(caught.value).startswith(f"rl.data.factory: {path!r}")


def test_a_callable_defined_in_a_trusted_module_resolves():
    assert import_callable("data.synthetic:copy_digit", key="rl.data.factory").__module__ == "data.synthetic"
    found = import_callable("tests.pure.test_rewards:says_hello", key="k", trusted=["tests.pure"])
    assert found.__name__ == "says_hello"
    assert set(PROJECT_CALLABLE_MODULES) >= {"data.synthetic", "algorithm.reward_rules"}
