"""Contract tests of compat/ (S-DEP-2): each fails when an internal a compat module
relies on is gone from the installed version, or when the installed version left the
range the module was written for, so `make lock` to a new torch, transformers, Ray,
Prefect or vLLM fails here, loudly, instead of running slower or wrong. vLLM's run only
where it is installed (`make test-vllm`)."""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compat import prefect_compat, ray_compat, torch_compat, transformers_compat
from compat.versions import installed_version
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("module, distribution", [
    (ray_compat, "ray"), (prefect_compat, "prefect"), (torch_compat, "torch"), (transformers_compat, "transformers"),
])
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


def test_rays_process_starter_builds_every_daemon_through_its_console_popen():
    """S-STOP-5: the GCS and the raylet leave the run's process group only through this."""
    from ray._private import services

    assert issubclass(services.ConsolePopen, subprocess.Popen)
    assert "ConsolePopen(" in inspect.getsource(services.start_ray_process)


def test_while_a_local_ray_starts_its_daemons_get_sessions_of_their_own(monkeypatch):
    from packaging.specifiers import SpecifierSet
    from ray._private import services

    def session_of_a_daemon() -> int:
        daemon = services.ConsolePopen([sys.executable, "-c", "import os; print(os.getsid(0))"], stdout=subprocess.PIPE)
        return int(daemon.communicate(timeout=30)[0])

    with ray_compat.daemons_in_sessions_of_their_own():
        started = services.ConsolePopen
        assert session_of_a_daemon() not in (os.getsid(0), 0)
    assert services.ConsolePopen is not started and session_of_a_daemon() == os.getsid(0)  # put back
    monkeypatch.setattr(ray_compat, "WRITTEN_FOR", SpecifierSet("<0.1"))  # outside the range: as Ray starts them
    with ray_compat.daemons_in_sessions_of_their_own():
        assert session_of_a_daemon() == os.getsid(0)


def test_ray_keeps_its_global_node_and_the_monitors_kill():
    from ray._private import node, worker

    assert hasattr(worker, "_global_node")
    assert "check_alive" in inspect.signature(node.Node.kill_monitor).parameters
    assert "self.head = head" in inspect.getsource(node.Node.__init__)


def test_rays_raylet_starts_each_worker_with_the_script_the_fork_client_recognises():
    from ray._private import node, workers

    assert (Path(workers.__file__).parent / ray_compat.WORKER_SCRIPT).is_file()
    assert f'"{ray_compat.WORKER_SCRIPT}"' in inspect.getsource(node.Node.__init__)  # its worker_path


def test_ray_init_still_takes_the_temp_dir_that_attaches_a_driver_to_a_joined_node():
    import ray

    source = inspect.getsource(ray.init)
    assert re.search(r"_temp_dir\b.*=\s*kwargs\.pop\(\s*[\"']_temp_dir[\"']", source)  # one of its private keywords
    assert ray_compat.attach_to_node("/tmp/ray-node") == {"_temp_dir": "/tmp/ray-node"}
    assert ray_compat.attach_to_node(None) == {}


def test_ray_actors_still_run_a_function_inside_through_ray_call():
    import ray.actor

    assert "def __ray_call__(" in inspect.getsource(ray.actor)


def test_prefect_keeps_its_server_app_and_answers_a_locked_database_with_a_retryable_503():
    from prefect.server.api import server

    assert callable(server.create_app)
    body = prefect_compat.locked_database_body()
    assert isinstance(body, dict) and body  # what processes/temporary_server.py retries on


def test_prefect_gives_its_own_temporary_server_the_settings_ours_gets():
    from prefect.server.api import server

    launch = inspect.getsource(server.SubprocessASGIServer._run_uvicorn_command)
    assert all(f'"{key}": "{value}"' in launch for key, value in prefect_compat.SERVER_ENV.items())
    assert "PREFECT__SERVER_EPHEMERAL" in inspect.getsource(server.create_app)


def test_prefect_reads_its_settings_from_the_sources_the_early_launch_reads():
    """processes/temporary_api.py decides from these sources' text, without Prefect: a
    new source would be one it does not read."""
    from prefect.settings import base

    sources = inspect.getsource(base.PrefectBaseSettings.settings_customise_sources)
    named = set(re.findall(r"\b([A-Z]\w+Source|ProfileSettingsTomlLoader)\(", sources))
    assert named == {"EnvFilterSettingsSource", "FilteredDotEnvSettingsSource", "PrefectTomlConfigSettingsSource",
                     "PyprojectTomlConfigSettingsSource", "ProfileSettingsTomlLoader"}


@pytest.mark.parametrize(("where", "text"), [
    ("profiles.toml", '[profiles.team]\nPREFECT_API_URL = "http://prefect.internal:4200/api"\n'),
    (".env", "PREFECT_API_URL=http://prefect.internal:4200/api\n"),
    ("prefect.toml", '[api]\nurl = "http://prefect.internal:4200/api"\n'),
    ("pyproject.toml", '[tool.prefect.api]\nurl = "http://prefect.internal:4200/api"\n'),
])
def test_prefect_takes_an_api_from_each_file_the_early_launch_reads(tmp_path, monkeypatch, where, text):
    from prefect.settings.models.root import Settings

    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    (home if where == "profiles.toml" else cwd).joinpath(where).write_text(
        'active = "team"\n' + text if where == "profiles.toml" else text)
    for key in [k for k in os.environ if k.startswith("PREFECT_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.chdir(cwd)
    assert Settings().api.url == "http://prefect.internal:4200/api"
    assert prefect_compat.standing_api_possible({"PREFECT_HOME": str(home)}, cwd) is True


def test_prefects_queue_services_still_drain_all():
    from prefect._internal.concurrency.services import QueueService
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    assert issubclass(APILogWorker, QueueService) and issubclass(EventsWorker, QueueService)
    assert "timeout" in inspect.signature(QueueService.drain_all).parameters


def test_dcp_metadata_names_exactly_the_private_globals_the_reader_allows(tmp_path):
    """A real DCP save: the globals its `.metadata` pickle names, less DCP's public
    classes (checkpoint/dcp_io.py), are the private ones compat/torch_compat.py allows."""
    import torch

    from checkpoint import dcp_io

    dcp_io.save_tensors({"w": torch.ones(2, 3), "step": torch.tensor(4)}, str(tmp_path))
    path = Path(torch_compat.dcp_metadata_path(dcp_io.SafeReader(str(tmp_path)), None))
    assert path == tmp_path / torch_compat.METADATA_FILE
    named = set()

    class Recording(pickle.Unpickler):  # our own file, just written: safe to unpickle
        def find_class(self, module, name):
            named.add((module, name))
            return super().find_class(module, name)

    with path.open("rb") as handle:
        Recording(handle).load()
    private = {(module, name) for module, name in named if name.startswith("_")}
    assert private == torch_compat.DCP_METADATA_PRIVATE_GLOBALS
    assert named - private <= dcp_io._PUBLIC_GLOBALS | {("torch", "float32"), ("torch", "int64")}


def test_dcp_readers_still_keep_their_metadata_path_and_public_fs():
    from torch.distributed.checkpoint import FileSystemReader

    reader = FileSystemReader("/tmp/somewhere")
    assert str(reader._get_metadata_path(None)) == str(torch_compat.dcp_metadata_path(reader, None))
    assert str(reader._get_metadata_path(1)).endswith("__1" + torch_compat.METADATA_FILE)
    assert hasattr(reader, "fs") and hasattr(reader, "path")


def test_vllms_llm_keeps_its_engine_config_and_executor_backend():
    pytest.importorskip("vllm")
    from vllm import LLM
    from vllm.config import ParallelConfig

    from compat import vllm_compat

    found = installed_version(vllm_compat.distribution())
    assert found is not None and vllm_compat.WRITTEN_FOR.contains(found), f"vLLM {found} is outside WRITTEN_FOR"
    assert "self.llm_engine" in inspect.getsource(LLM.__init__)
    assert "distributed_executor_backend" in ParallelConfig.__dataclass_fields__


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
    assert transformers_compat.declared_blocks(model) == set(model._no_split_modules) != set()
    declared = block_modules(model)
    assert declared and len(declared) == model.config.num_hidden_layers
    model._no_split_modules = None
    assert block_modules(model) == declared


def test_outside_their_ranges_the_modules_take_their_public_paths(monkeypatch, tmp_path):
    """Each fallback as the code under it sees it; the Ray and Prefect ones are also run
    for real in tests/services/test_compat_fallbacks.py."""
    import torch
    from packaging.specifiers import SpecifierSet
    from torch.distributed.checkpoint import FileSystemReader

    from checkpoint import dcp_io

    for module in (torch_compat, transformers_compat, ray_compat, prefect_compat):
        monkeypatch.setattr(module, "WRITTEN_FOR", SpecifierSet("<0.1"))
    reader = FileSystemReader(str(tmp_path))
    for rank in (None, 1):
        assert str(torch_compat.dcp_metadata_path(reader, rank)) == str(reader._get_metadata_path(rank))
    # Only DCP's public classes are read: a checkpoint whose metadata names torch's private ones is refused.
    assert torch_compat.dcp_metadata_private_globals() == frozenset()
    dcp_io.save_tensors({"w": torch.ones(2)}, str(tmp_path))
    with pytest.raises(dcp_io.UnsafeCheckpointFile, match="_MEM_FORMAT_ENCODING|_StorageInfo|_get_layout"):
        dcp_io.load_tensors({"w": torch.zeros(2)}, str(tmp_path), alone=True)

    class Declares:
        _no_split_modules = ["Block"]

    assert transformers_compat.declared_blocks(Declares()) == set()
    assert ray_compat.worker_script() is None
    assert ray_compat.call_inside(object(), print) is None  # the actor is never touched
    assert prefect_compat.standing_api_possible({}, tmp_path) is True  # Prefect decides


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


def test_the_temporary_api_keeps_a_smaller_sqlite_page_cache_than_prefect_gives(tmp_path):
    """S-FOOT-1: Prefect sets its 80 MiB cache when a connection opens; the cap set at
    each checkout is what the API's queries then run with (its memory grew with the
    run's database without it)."""
    import sqlalchemy as sa
    from prefect.server.database.configurations import AioSqliteConfiguration
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    async def cache_size() -> int:
        engine = await AioSqliteConfiguration(f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}").engine()
        try:
            async with engine.connect() as connection:
                return (await connection.execute(sa.text("PRAGMA cache_size"))).scalar_one()
        finally:
            await engine.dispose()

    assert asyncio.run(cache_size()) == 20000  # Prefect's own, in pages
    prefect_compat.cap_sqlite_page_cache()
    try:
        assert asyncio.run(cache_size()) == -prefect_compat.SQLITE_PAGE_CACHE_KIB
    finally:
        event.remove(Pool, "checkout", prefect_compat.sqlite_page_cache_at_checkout)


def test_task_run_lookups_by_flow_run_task_key_and_dynamic_key_use_prefects_index_on_sqlite(tmp_path):
    """S-FOOT-1: Prefect's task-run recorder looks task runs up by a tuple IN, which
    SQLAlchemy writes for SQLite as `IN (VALUES ...)` and SQLite answers by reading every
    task run (the temporary API's CPU per iteration grew by a third over 10,000
    iterations). Read through a subquery, the same lookup finds the same rows through
    Prefect's unique index."""
    import sqlite3
    import uuid

    import sqlalchemy as sa
    from prefect.server.database.orm_models import Base, TaskRun
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    path = tmp_path / "prefect.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine, tables=[TaskRun.__table__])
    flow_run = str(uuid.uuid4())
    rows = [(str(uuid.uuid4()), flow_run, f"stage-{i % 8}", str(i)) for i in range(400)]
    with sqlite3.connect(path) as raw:
        raw.executemany("INSERT INTO task_run (id, flow_run_id, task_key, dynamic_key, name, run_count, "
                        "flow_run_run_count, total_run_time, created, updated) "
                        "VALUES (?, ?, ?, ?, 'x', 0, 0, 0, 0, 0)", rows)
    wanted = [(flow_run, key, dynamic) for _, _, key, dynamic in rows[::50]]
    natural_key = sa.tuple_(TaskRun.flow_run_id, TaskRun.task_key, TaskRun.dynamic_key)
    lookup = sa.select(TaskRun.id).where(sa.or_(TaskRun.id.in_([rows[1][0]]), natural_key.in_(wanted)))
    sent: list[str] = []

    def found() -> set[str]:
        sent.clear()
        with engine.connect() as connection:
            return {str(i) for i in connection.execute(lookup).scalars()}

    def plan(statement: str) -> str:
        with sqlite3.connect(path) as raw:
            parameters = [rows[1][0], *(value for key in wanted for value in key)]
            return " | ".join(row[3] for row in raw.execute(f"EXPLAIN QUERY PLAN {statement}", parameters))

    listen = lambda connection, cursor, statement, *_: sent.append(statement)  # noqa: E731
    event.listen(Engine, "after_cursor_execute", listen)
    try:
        before = found()
        assert prefect_compat.TUPLE_IN_VALUES in sent[0] and "SCAN task_run" in plan(sent[0])  # every row read
        prefect_compat.index_tuple_lookups_on_sqlite()
        after = found()
        assert "uq_task_run__flow_run_id_task_key_dynamic_key" in plan(sent[0]) and "SCAN task_run" not in plan(sent[0])
        assert after == before == {rows[1][0]} | {row[0] for row in rows[::50]}
    finally:
        event.remove(Engine, "after_cursor_execute", listen)
        event.remove(Engine, "before_cursor_execute", prefect_compat.tuple_in_through_subquery)
        engine.dispose()


def test_a_tuple_in_is_rewritten_whole_and_nothing_else_is():
    rewrite = prefect_compat.rewrite_tuple_in
    assert rewrite("SELECT 1 FROM t WHERE a IN (?, ?)") == "SELECT 1 FROM t WHERE a IN (?, ?)"
    assert rewrite("SELECT 1 FROM t WHERE (a, b) IN (VALUES (?, ?), (?, ?)) AND c = ')'") == (
        "SELECT 1 FROM t WHERE (a, b) IN (SELECT * FROM (VALUES (?, ?), (?, ?))) AND c = ')'"
    )
    twice = rewrite("x IN (VALUES (?)) OR y IN (VALUES (?, '(')) ")
    assert twice == "x IN (SELECT * FROM (VALUES (?))) OR y IN (SELECT * FROM (VALUES (?, '('))) "
    assert rewrite("x IN (VALUES (?)") == "x IN (VALUES (?)"  # unbalanced: left as it is
