"""Your own profile as a deployment of its own (issue 46): on the stack `make serve`
brings up, `make deploy PROFILE=... NAME=my-gpt2` creates `ppo/my-gpt2`; a run of it
trains the user's GPT-2 with the reward module beside the profile (nothing on
PYTHONPATH) and is listed under that name; running it again after it finished ends
Completed with the "is complete" message, starting nothing.

Slow (a Prefect server, a worker and a run: minutes on 2 cores):
`pytest -m slow tests/services/test_own_deployment.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

from tests.conftest import REPO_ROOT
from tests.support.prefect_stack import free_port, kill_pids, pids_with_env, run_script
from tests.support.user_project import write_user_project

pytestmark = [pytest.mark.slow]

SCORES = "def score(ctx):\n    return ctx.completion.strip() == ctx.reference\n"
SHORT = ["rl.max_steps=1", "rl.batch_size=8", "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1"]


def _run_deployment(env: dict[str, str], name: str) -> tuple[str, subprocess.CompletedProcess]:
    result = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", f"ppo/{name}", "--watch", "--watch-timeout", "600"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=700,
    )
    match = re.search(r"UUID: ([0-9a-f-]{36})", result.stdout)
    assert match, result.stdout[-3000:] + result.stderr[-3000:]
    return match.group(1), result


def test_make_deploy_creates_your_own_deployment_and_it_runs(tmp_path, user_models):
    project = tmp_path / "my-project"
    profile = write_user_project(project, user_models.plain, module="deployed_rewards", reward_source=SCORES)
    # The short run's settings, written in the profile: a deployment takes its profile as it is.
    profile.write_text(profile.read_text() + "\nfrom configs.loading import apply_overrides\n"
                       f"CONFIG = apply_overrides(CONFIG, {SHORT!r})\n")
    state_dir = tmp_path / "stack"
    marker = uuid.uuid4().hex
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PREFECT_API_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")}
    env.update(PPO_PREFECT_STATE_DIR=str(state_dir), PPO_PREFECT_PORT=str(free_port()), PPO_PYTHON=sys.executable,
               PPO_PREFECT_DB="sqlite", PPO_TEST_OWN_STACK=marker)
    serve = run_script("serve.sh", env, timeout=600)
    try:
        assert serve.returncode == 0, serve.stdout[-3000:] + serve.stderr[-3000:]
        # Without PPO_PREFECT_STATE_DIR: make deploy finds the stack from the record serve.sh left
        # (tests/support/prefect_stack.py puts it beside the stack's state).
        found_by_record = {key: value for key, value in env.items() if key != "PPO_PREFECT_STATE_DIR"}
        found_by_record["PPO_PREFECT_SERVE_RECORD"] = str(state_dir / "serve-record.json")
        deployed = subprocess.run(["make", "deploy", f"PROFILE={profile}", "NAME=my-gpt2"], cwd=REPO_ROOT,
                                  env=found_by_record, capture_output=True, text=True, timeout=300)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        assert "deployment ppo/my-gpt2 (" in deployed.stdout and str(profile) in deployed.stdout

        stack_env = dict(env, PREFECT_HOME=str(state_dir / "home"),
                         PREFECT_API_URL=f"http://127.0.0.1:{env['PPO_PREFECT_PORT']}/api")
        flow_run_id, first = _run_deployment(stack_env, "my-gpt2")
        assert first.returncode == 0 and "Completed" in first.stdout, first.stdout[-3000:] + first.stderr[-3000:]
        assert (project / "outputs" / "my-run" / "final_model" / "policy" / "config.json").is_file()

        again_id, again = _run_deployment(stack_env, "my-gpt2")
        assert again.returncode == 0 and "Completed" in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]

        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: stack_env["PREFECT_API_URL"]}):
            with get_client(sync_client=True) as client:
                deployment = client.read_deployment_by_name("ppo/my-gpt2")
                runs = {run_id: client.read_flow_run(uuid.UUID(run_id)) for run_id in (flow_run_id, again_id)}
        assert deployment.parameters["profile"] == str(profile)
        assert {run.deployment_id for run in runs.values()} == {deployment.id}
        finished = runs[again_id].state
        assert finished.is_completed() and "is complete: iteration 1 of 1" in (finished.message or "")
    finally:
        stop = run_script("stop.sh", env, timeout=300)
        kill_pids(pids_with_env(f"PPO_TEST_OWN_STACK={marker}"))
        assert stop.returncode == 0, stop.stdout + stop.stderr
