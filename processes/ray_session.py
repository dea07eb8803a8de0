"""The Ray a run uses: started here (a local Ray of the run's own) or joined (a cluster).

Imports nothing heavy: the command line starts Ray through this module before it
imports torch, transformers or the role bodies, so that Ray's daemons, the fork server
and the Prefect API come up while those imports run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from compat.ray_compat import (
    attach_to_node,
    daemons_in_sessions_of_their_own,
    fork_launch_supported,
    stop_autoscaler_monitor,
    worker_python,
    worker_script,
)
from configs.code_folders import CODE_DIRS_ENV, SHIPPED_CODE_ENV
from processes.code_shipping import shipped_code
from processes.fork_client import SOCKET_ENV, WORKER_SCRIPT_ENV
from processes.fork_launch import ForkServer, fork_workers_enabled, py_executable, start_fork_server, write_launcher
from processes.process_tree import MARK_ENV, end_processes, marked

if TYPE_CHECKING:
    from configs.schema import PPOConfig

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)

# Settings of a local Ray, each a default a user's own setting wins over.
LOCAL_RAY_DEFAULTS = {
    # The workers Ray prestarts are plain Python processes; every role actor gets a
    # worker of the run's own runtime environment instead, so they would only idle.
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
}

# Ray's settings for every process of a run, each a default a user's own setting wins over
# (cli/environment.py applies them from the start of the command, this module when Ray starts).
RAY_DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no internet
    # Tensors between actors through Ray's numpy path: no torch pickling on every
    # trajectory hop. They arrive read-only; every stage builds new tensors.
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    # S-FOOT-1: no task events. Ray's GCS kept every actor call's state changes (up to
    # 100,000 calls: 43 MiB per 1,000 tiny iterations, measured) for the dashboard's task
    # list and `ray list tasks`, which a local Ray started without its dashboard never
    # shows. A user who wants them sets RAY_task_events_report_interval_ms=1000.
    "RAY_task_events_report_interval_ms": "0",
}

SERVED_RAY_ENV = "PPO_FORK_SERVER_RAY"  # the GCS address of the Ray whose workers the server at SOCKET_ENV forks
LEFTOVER_WAIT_S = 0.5  # after ray.shutdown(), for the local Ray's processes to end by themselves
# Set by deployments/kubernetes/join-ray-then.sh: the temp dir of the zero-capacity node it
# started, so the driver attaches to that node (S-TEAM-2) and not to another on the host.
JOINED_NODE_ENV = "PPO_RAY_NODE_TEMP_DIR"
# Who made RAY_AUTH_TOKEN for a local Ray of its own (`pid:digest`): its children inherit
# that token to join that Ray, but the token is never a cluster's.
MINTED_BY_ENV = "PPO_RAY_TOKEN_MINTED_BY"


class ClusterTokenMissing(RuntimeError):
    """A run names a cluster but holds only the token it made for a local Ray."""


def worker_env(code_dirs: tuple[str, ...] = ()) -> dict[str, str]:
    """Environment of every actor process: the project importable, the run's code
    folders named (S-BYO-3: the roles that import named code append them to their path,
    configs/code_folders.py), one BLAS thread, and the quiet, offline settings the
    whole run uses."""
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (PROJECT_ROOT, os.environ.get("PYTHONPATH", "")) if p),
        CODE_DIRS_ENV: os.pathsep.join(code_dirs),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        # docs/performance-log.md section 3; `RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=0` turns it off.
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get(
            "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", RAY_DEFAULTS["RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"]
        ),
    }


@dataclass
class RaySession:
    """The Ray this process started or joined, with what it started for it: the fork
    server, the mark in the environment of every process of a local Ray (MARK_ENV), and
    the launcher folder. `close()` is the whole teardown; `end_now()` is a hard stop's."""

    address: str | None  # the cluster joined; None for a local Ray of this process's own
    fork_server: ForkServer | None = None
    mark: str | None = None
    launcher_dir: str | None = None  # the launcher's folder when no fork server holds it

    def close(self) -> None:
        """Stop Ray, then the fork server its workers came from (its children are gone
        with Ray; any left are killed with it), then whatever the local Ray started that
        is still running a moment later (S-STOP-5). Each step runs whatever the one
        before did."""
        import ray

        try:
            stop_autoscaler_monitor()
        finally:
            try:
                ray.shutdown()
            finally:
                try:
                    self.stop_fork_server()
                finally:
                    self.end_processes(LEFTOVER_WAIT_S)

    def end_now(self) -> None:
        """A hard stop, which exits next: every process of the local Ray ended at once."""
        self.end_processes(0.0)

    def end_processes(self, wait_s: float) -> None:
        """End every process the local Ray started (its daemons, their agents, its
        workers, the fork server) still running after `wait_s`. Nothing for a joined Ray."""
        if self.mark is not None:
            end_processes(marked(self.mark), wait_s)
            self.mark = None
        if self.launcher_dir is not None:
            shutil.rmtree(self.launcher_dir, ignore_errors=True)
            self.launcher_dir = None

    def stop_fork_server(self) -> None:
        if self.fork_server is not None:
            os.environ.pop(SOCKET_ENV, None)
            os.environ.pop(SERVED_RAY_ENV, None)
            self.fork_server.stop()
            self.fork_server = None


def init_ray(address: str | None = None, num_cpus: int | None = None, code_dirs: tuple[str, ...] = ()) -> RaySession:
    """Join the Ray cluster at `address`, or start a local Ray of this process's own,
    whose processes import the modules in `code_dirs` (the launch's, S-BYO-3)."""
    return join_ray(address, code_dirs) if address else start_local_ray(num_cpus, code_dirs)


def start_local_ray(num_cpus: int | None = None, code_dirs: tuple[str, ...] = ()) -> RaySession:
    """A new Ray of this run's own, never a cluster some other process started on this
    machine (plain ray.init() would join that one).

    Ray 2.60 listens on every interface whatever node address it is given, so it requires
    a token (S-SEC-1): a fresh random one per process, held in this process's environment
    (inherited by the Ray daemons and workers it starts), never written to the home
    directory. Its workers fork from a process that has imported torch, transformers and
    the role bodies once (processes/fork_server.py), unless PPO_FORK_WORKERS=0; a driver
    this process starts that joins the same Ray (a test's command-line run) forks its
    workers from the same server. They take their settings from the raylet's environment,
    not a runtime environment, and so start without Ray's setup_worker.py shim."""
    import ray

    require_local_ray_auth()
    session = RaySession(address=None, mark=secrets.token_hex(8))
    env_vars = {**worker_env(code_dirs), MARK_ENV: session.mark}  # S-STOP-5: how its processes are found at the end
    # The autoscaler's Prometheus endpoint is the one listener of a local Ray that answers
    # anyone (0.0.0.0:44217, no token). A local Ray never autoscales: an invalid port makes
    # Ray skip that server (it logs the failed start in monitor.log). A user who sets the
    # variable keeps their own port.
    os.environ.setdefault("AUTOSCALER_METRIC_PORT", "-1")
    for key, value in {**LOCAL_RAY_DEFAULTS, **RAY_DEFAULTS}.items():
        os.environ.setdefault(key, value)
    try:
        if fork_workers_enabled() and fork_launch_supported():
            session.fork_server = start_fork_server({**os.environ, **env_vars})
            env_vars[SOCKET_ENV] = session.fork_server.socket_path
            env_vars[WORKER_SCRIPT_ENV] = worker_script() or ""  # "": nothing is forked
        with _local_ray_environment(env_vars, _launcher(session)):
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **_init_options())
    except BaseException:
        session.stop_fork_server()
        session.end_processes(0.0)
        raise
    if session.fork_server is not None:
        # Inherited by the processes this one starts (see shared_fork_server).
        os.environ[SOCKET_ENV] = session.fork_server.socket_path
        os.environ[SERVED_RAY_ENV] = ray.get_runtime_context().gcs_address
    return session


def join_ray(address: str, code_dirs: tuple[str, ...] = ()) -> RaySession:
    """Join a cluster with its own settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN or
    RAY_AUTH_TOKEN_PATH, docs/launch.md). A joined Ray's raylet knows nothing of this
    run: its settings, the fork client of a local Ray handed down here, and the run's
    code folders (shipped to every node, processes/code_shipping.py) come in a runtime
    environment; a cluster's own workers start as Ray starts them."""
    import ray

    env_vars = worker_env()  # a node may lack the code folders' paths: they are shipped instead
    socket_path = shared_fork_server(address) if fork_workers_enabled() else None
    if socket_path is not None:
        env_vars[SOCKET_ENV] = socket_path
        env_vars[WORKER_SCRIPT_ENV] = worker_script() or ""
    for key, value in RAY_DEFAULTS.items():
        os.environ.setdefault(key, value)
    require_cluster_token(address)
    runtime_env: dict[str, Any] = {"env_vars": env_vars}
    if socket_path is not None:
        runtime_env["py_executable"] = py_executable()
    joined_node = os.environ.get(JOINED_NODE_ENV) or None
    with shipped_code(code_dirs) as (py_modules, names):
        if py_modules:
            runtime_env["py_modules"] = py_modules
            env_vars[SHIPPED_CODE_ENV] = os.pathsep.join(names)
        ray.init(address=address, runtime_env=runtime_env, **attach_to_node(joined_node), **_init_options())
    return RaySession(address=address)


def _init_options() -> dict[str, Any]:
    return {"log_to_driver": os.environ.get("PPO_ACTOR_LOGS", "0") == "1", "ignore_reinit_error": True}


def _launcher(session: RaySession) -> str | None:
    """What the raylet runs for `python`: the fork server's launcher, or with
    PPO_FORK_WORKERS=0 the same launcher without a server behind it, so that Ray's
    Python daemons still get a process group of their own (S-STOP-5: a SIGTERM to the
    run's group must not end the agents, whose end ends the raylet, before the commit)."""
    if session.fork_server is not None:
        return session.fork_server.launcher
    if not fork_launch_supported():
        return None
    session.launcher_dir = tempfile.mkdtemp(prefix="ppo-launcher-")  # mode 0700
    return write_launcher(session.launcher_dir)


@contextlib.contextmanager
def _local_ray_environment(env_vars: dict[str, str], launcher: str | None) -> Iterator[None]:
    """While a local Ray starts: `env_vars` in the environment its daemons inherit (the
    raylet passes its own to every worker), `launcher` (processes/fork_launch.py) as
    the Python the raylet runs for its workers, and each daemon in a session of its own,
    out of reach of a signal to the run's process group (S-STOP-5). The environment is
    put back as it was afterwards: this process keeps its own."""
    saved = {key: os.environ.get(key) for key in env_vars}
    os.environ.update(env_vars)
    try:
        with worker_python(launcher), daemons_in_sessions_of_their_own():
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def shared_fork_server(address: str) -> str | None:
    """The socket of the fork server of the Ray at `address`, when the process that
    started that Ray on this machine handed it down; None for any other cluster."""
    socket_path = os.environ.get(SOCKET_ENV)
    if os.environ.get(SERVED_RAY_ENV) == address and socket_path and os.path.exists(socket_path):
        return socket_path
    return None


class RayAuthRefused(RuntimeError):
    """The environment turns off the token authentication a local Ray requires."""


def protect_local_ray(environ: "os._Environ[str] | dict[str, str]") -> None:
    """Token authentication for a Ray this process starts, unless the user has
    chosen a token of their own. An explicit RAY_AUTH_MODE=disabled is refused: it
    would leave the run's control ports open to the network.

    Ray reads these settings once, when it is imported: a process sets them before its
    first `import ray` (`prepare_ray_auth`), so that its driver and every process it
    starts agree, with nothing of Ray's refreshed afterwards."""
    mode = environ.get("RAY_AUTH_MODE", "token")
    if mode != "token":
        raise RayAuthRefused(
            f"RAY_AUTH_MODE={mode!r}: a local Ray listens on every network interface, so the run requires token "
            "authentication; unset RAY_AUTH_MODE (the run then makes its own token) or set it to 'token'"
        )
    environ["RAY_AUTH_MODE"] = "token"
    if not environ.get("RAY_AUTH_TOKEN") and not environ.get("RAY_AUTH_TOKEN_PATH"):
        environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        if environ is os.environ:
            environ[MINTED_BY_ENV] = _minted_by(environ["RAY_AUTH_TOKEN"])


def require_cluster_token(address: str) -> None:
    """S-TEAM-2: a run joins a cluster with the cluster's token or not at all. A flow
    process whose profile or parameters name the cluster (`grid.ray_address`) without
    RAY_ADDRESS in its environment made a token of its own at import, for a local Ray;
    Ray has read it, so it cannot join with another one now."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token and os.environ.get(MINTED_BY_ENV) == _minted_by(token):
        raise ClusterTokenMissing(
            f"the run names the Ray cluster at {address} but its process has no token for it: "
            f"set RAY_ADDRESS={address} and the cluster's token (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH naming a file) "
            "in the environment the flow starts in (the work pool's job variables, or "
            "deployments/kubernetes/join-ray-then.sh), then run it again"
        )


def prepare_ray_auth(joins_cluster: bool) -> None:
    """Before this process's first `import ray`: the settings of a local Ray's token
    authentication (S-SEC-1), or nothing for a process that joins a cluster (whose own
    RAY_AUTH_* settings apply). Entry points call it as soon as they know which; once
    Ray is imported it changes nothing (`require_local_ray_auth` then says why)."""
    if not joins_cluster and "ray" not in sys.modules:
        protect_local_ray(os.environ)


def require_local_ray_auth() -> None:
    """A local Ray is started only by a driver whose auth settings were made before Ray
    read them (at import): otherwise the driver could not join the Ray it starts."""
    if "ray" not in sys.modules:
        protect_local_ray(os.environ)
        return
    protect_local_ray(dict(os.environ))  # an explicit RAY_AUTH_MODE=disabled is named as such
    if not _auth_ready(os.environ):
        raise RuntimeError(
            "Ray was imported before the run's Ray authentication settings were made: call "
            "processes.ray_session.prepare_ray_auth(joins_cluster=False) before the first `import ray`, "
            "or set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) yourself"
        )


def _auth_ready(environ: "os._Environ[str] | dict[str, str]") -> bool:
    return environ.get("RAY_AUTH_MODE") == "token" and bool(
        environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH")
    )


def _minted_by(token: str) -> str:
    return f"{os.getpid()}:{hashlib.sha256(token.encode()).hexdigest()[:16]}"


def connect_ray(config: PPOConfig, code_dirs: tuple[str, ...] = ()) -> RaySession | None:
    """Join `grid.ray_address`/RAY_ADDRESS or start a local Ray, its processes importing
    the launch's `code_dirs`; None when this process is connected already (whoever
    connected it closes it, and chose its code folders). Actors are named inside the
    run's own namespace, so one cluster can host several runs."""
    import ray

    if ray.is_initialized():
        return None
    return init_ray(config.grid.ray_address or os.environ.get("RAY_ADDRESS"), config.grid.ray_num_cpus, code_dirs)
