"""The pre-flight is one list (rundir/preflight_checks.py, S-RUN-3): check_manifest runs
MANIFEST_CHECKS and nothing else, so a reader sees every check, in order, in one file,
and a check written outside the list fails here."""

from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import replace

from rundir import preflight_checks, run_checks
from rundir.preflight_checks import MANIFEST_CHECKS, check_manifest, schema_validators

# What check_manifest called, in this order, before the list existed.
CALLED_BEFORE = (
    "describe_run", "check_placement", "check_model", "describe_update", "check_critic_start", "check_reward",
    "check_memory", "check_training_data", "check_openings", "check_validation_data", "check_served_reward_text",
    "check_checkpoints", "check_options", "note_profile_folder",
)


def test_the_list_holds_every_check_check_manifest_made_in_the_same_order():
    assert tuple(check.body.__name__ for check in MANIFEST_CHECKS) == CALLED_BEFORE
    assert all(check.name and check.checks and check.keys for check in MANIFEST_CHECKS)


def test_every_function_that_takes_a_manifest_run_is_in_the_list():
    """A check is a function of a ManifestRun; one the list lacks would never run."""
    listed = {check.body for check in MANIFEST_CHECKS}
    takes_a_run = {
        function for _, function in inspect.getmembers(run_checks, inspect.isfunction)
        if function.__module__ == run_checks.__name__
        and run_checks.ManifestRun in typing.get_type_hints(function).values()
    }
    assert takes_a_run == listed, takes_a_run ^ listed


def test_check_manifest_calls_no_check_of_its_own():
    tree = ast.parse(inspect.getsource(preflight_checks.check_manifest))
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert called <= {"ManifestRun", "plan_placement", "ManifestReport"}, called


def test_check_manifest_runs_the_list_in_order(monkeypatch):
    from configs.loading import load_config
    from tests.conftest import TINY_PROFILE

    ran = []
    probes = tuple(
        replace(check, body=lambda _, name=check.name: ran.append(name)) for check in MANIFEST_CHECKS
    )
    monkeypatch.setattr(preflight_checks, "MANIFEST_CHECKS", probes)
    assert check_manifest(load_config(TINY_PROFILE)).problems == []
    assert ran == [check.name for check in MANIFEST_CHECKS]


def test_the_schema_validators_are_listed_from_the_schema_under_their_section():
    rows = {(section, name) for section, name, _ in schema_validators()}
    assert ("rl.env", "_known_format") in rows and ("(top)", "_critic_keys_need_a_critic") in rows
    assert ("rl.data", "_exactly_one_source") in rows and ("rl.validation.data", "_exactly_one_source") in rows
    assert all(what for _, _, what in schema_validators())
