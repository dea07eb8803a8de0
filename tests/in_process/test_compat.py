"""Contract tests of compat/ (S-DEP-2): each fails when an internal a compat module
relies on is gone from the installed version, or when the installed version left the
range the module was written for, so `make lock` to a new Ray or Prefect fails here,
loudly, instead of running slower or wrong."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import pytest

from compat import prefect_compat, ray_compat
from compat.versions import installed_version
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("module, distribution", [(ray_compat, "ray"), (prefect_compat, "prefect")])
def test_the_installed_version_is_one_the_module_was_written_for(module, distribution):
    found = installed_version(distribution)
    assert found is not None and module.WRITTEN_FOR.contains(found), (
        f"{distribution} {found} is outside {module.__name__}.WRITTEN_FOR ({module.WRITTEN_FOR}): check each "
        "internal it uses against the new version, then widen the range"
    )


def test_rays_process_starter_names_the_python_it_runs_through_its_sys_module():
    from ray._private import services

    assert services.sys is sys
    # The worker command of a local Ray's raylet: built from `sys.executable` of services' own `sys`.
    assert "sys.executable" in inspect.getsource(services.start_raylet)


def test_ray_keeps_its_global_node_and_the_monitors_kill():
    from ray._private import node, worker

    assert hasattr(worker, "_global_node")
    assert "check_alive" in inspect.signature(node.Node.kill_monitor).parameters
    assert "self.head = head" in inspect.getsource(node.Node.__init__)


def test_prefect_keeps_its_server_app_and_answers_a_locked_database_with_a_retryable_503():
    from prefect.server.api import server

    assert callable(server.create_app)
    body = prefect_compat.locked_database_body()
    assert isinstance(body, dict) and body  # what processes/temporary_server.py retries on


def test_prefects_artifact_create_still_takes_the_sync_switch():
    from prefect._internal.compatibility import async_dispatch
    from prefect.artifacts import Artifact

    assert Artifact.create.__module__ == "prefect.artifacts"
    assert 'kwargs.pop("_sync", None)' in inspect.getsource(async_dispatch.async_dispatch)
    assert "@async_dispatch(acreate)" in inspect.getsource(Artifact)


def test_transformers_models_still_name_their_blocks(tiny_model_dir):
    """trainer/sharding.py shards each block the model declares unsplittable; if
    transformers stopped declaring them, the fallback (the longest layer list) must
    find the same blocks."""
    from transformers import AutoModelForCausalLM

    from trainer.sharding import block_modules

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    declared = block_modules(model)
    assert declared and len(declared) == model.config.num_hidden_layers
    model._no_split_modules = None
    assert block_modules(model) == declared


def test_a_version_outside_the_range_says_which_public_path_it_takes(monkeypatch, capsys):
    from packaging.specifiers import SpecifierSet

    monkeypatch.setattr(prefect_compat, "WRITTEN_FOR", SpecifierSet("<1"))
    assert not prefect_compat.temporary_api_supported()
    line = capsys.readouterr().err.strip()
    assert line.startswith("prefect 3.") and "written for prefect<1" in line and "Prefect starts its own server" in line


FORKS_ONLY_SINGLE_THREADED = textwrap.dedent(
    """
    import json, os, socket, struct, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from processes import fork_server

    def ask(script):
        server_end, client_end = socket.socketpair()
        body = json.dumps({"argv": [script], "env": {}, "cwd": "/"}).encode()
        socket.send_fds(client_end, [struct.pack("!I", len(body))], [0, 1, 2])
        client_end.sendall(body)
        return fork_server._fork_worker(server_end, [], ())

    pid = ask("/dev/null")
    assert pid and os.waitpid(pid, 0)[1] == 0, "a single-threaded server forks"
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    assert ask("/dev/null") is None, "a server with a second thread must not fork"
    print("ok")
    """
)


def test_the_fork_server_forks_only_while_it_has_one_thread():
    done = subprocess.run([sys.executable, "-c", FORKS_ONLY_SINGLE_THREADED, str(REPO_ROOT)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    assert "2 threads in this process; not forking" in done.stderr
