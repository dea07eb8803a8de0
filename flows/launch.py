"""A run's set-up, decided once: the resolved config, its directory, where it resumes
from, and the role actors launched ahead of the flow. The command line builds it
before any service starts and hands it to the `ppo` flow it calls; a flow run nobody
handed one (a deployment's) builds its own the same way."""

from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from configs.code_folders import code_dirs_of
from configs.schema import PPOConfig
from flows.launch_mode import ByCommand, ByDeployment, LaunchMode
from rundir.base_model import pin_hub_model
from rundir.resume import ResumePoint, resume_boundary
from rundir.preflight_checks import require_runnable
from rundir.run_config import resolve_config
from rundir.run_identity import RunIdentity
from rundir.run_lock import RunLock
from flows.stopping import StopRequest, stop_request
from rundir.run_outputs import RunPaths

if TYPE_CHECKING:
    from processes.actors import LaunchedActors
    from processes.ray_session import RaySession


@dataclass(frozen=True)
class LaunchParameters:
    """The `ppo` flow's parameters a launch was planned from."""

    profile: str
    overrides: tuple[str, ...]
    critic_warmup_iterations: int | None
    run_name: str | None
    resume: bool
    resume_from: str | None


@dataclass
class Launch:
    config: PPOConfig  # resolved once: profile, overrides, the flow's own parameters; absolute paths
    paths: RunPaths
    resume_point: ResumePoint | None  # checked (pointer, marker, warmup) before anything started
    actors: LaunchedActors | None = None  # launched while the services came up; the flow adopts them
    lock: RunLock | None = None  # taken before any service started; the flow holds it on and releases it
    stop: StopRequest = field(default_factory=StopRequest)  # signals and the time limit (S-STOP)
    parameters: LaunchParameters | None = None  # what it was planned from: the flow taking it must say the same
    packer: str | None = None  # which DataPacker shapes the prompts (S-BYO-1), as the pre-flight found it
    profile_notes: tuple[str, ...] = ()  # files beside the profile named like a module (configs/profile_folder.py)
    # Decided once, by whoever launched it: the command line (which hands the launch to the
    # flow it runs in-process) or a deployment's flow run planning its own.
    mode: LaunchMode = field(default_factory=ByDeployment)
    ray: RaySession | None = None  # the Ray connected for it, closed by whoever connected it
    identity: RunIdentity | None = None  # what the run is, read once here; every commit records it (S-CKPT-4)
    # S-BYO-3: the folders whose modules config values name by bare name (the profile's own),
    # handed to every process the run starts, and shipped to a joined cluster's nodes.
    code_dirs: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        """Every iteration committed and the model exported: running it again would do
        nothing, so nothing is started (a rerun of a run stopped before its export
        still exports, S-STOP-4)."""
        point = self.resume_point
        return (
            point is not None and not point.went_back and point.iteration == self.config.rl.max_steps
            and os.path.isdir(self.paths.final_model)
        )

    def finished_line(self) -> str:
        return (
            f"run {self.config.job.name!r} is complete: iteration {self.config.rl.max_steps} of "
            f"{self.config.rl.max_steps} committed and the model exported to {self.paths.final_model}; nothing to do. "
            "Raise rl.max_steps to train on from it, or start a new job.name"
        )

    def adopt_actors(self) -> LaunchedActors | None:
        """The launched actors, now the caller's to start or kill: taken once."""
        actors, self.actors = self.actors, None
        return actors


def plan_launch(
    profile: str, overrides: list[str] | None, critic_warmup_iterations: int | None, run_name: str | None,
    *, resume: bool, resume_from: str | None,
) -> Launch:
    """Everything a run can be refused for before it starts anything: a config it cannot
    run here, a resume point it cannot use."""
    config = resolve_config(profile, overrides, critic_warmup_iterations, run_name)
    checked = require_runnable(config, profile=profile)  # S-BYO-2: the pre-flight --validate-manifest prints
    config = pin_hub_model(config)  # after the checks that answer in a second: this may download
    paths = RunPaths.for_config(config)
    identity = RunIdentity.at_launch(config)  # read once: the resume checks it, every commit records it
    point = resume_boundary(config, paths, resume=resume, resume_from=resume_from, identity=identity)
    planned_from = LaunchParameters(
        profile, tuple(overrides or ()), critic_warmup_iterations, run_name, resume, resume_from
    )
    return Launch(config, paths, point, stop=stop_request(config), parameters=planned_from, packer=checked.packer,
                  profile_notes=tuple(checked.profile_notes), identity=identity, code_dirs=code_dirs_of(profile))


_handed: ContextVar[Launch | None] = ContextVar("ppo_launch", default=None)


@contextlib.contextmanager
def handed_to_the_flow(launch: Launch) -> Iterator[None]:
    """The `ppo` flow called inside takes `launch` instead of planning its own."""
    launch.mode = ByCommand()
    token = _handed.set(launch)
    try:
        yield
    finally:
        _handed.reset(token)


def handed_launch() -> Launch | None:
    return _handed.get()


def current_mode() -> LaunchMode:
    """How this flow run was launched, also before (or without) its launch being planned."""
    handed = handed_launch()
    return handed.mode if handed is not None else ByDeployment()


def take_launch(
    profile: str, overrides: list[str] | None, critic_warmup_iterations: int | None, run_name: str | None,
    *, resume: bool, resume_from: str | None,
) -> Launch:
    """The set-up the command line handed over, else (a deployment) this flow run's own.
    A handed set-up was planned from these very parameters, so the flow run's
    parameters in the Prefect UI are what it runs with."""
    handed = handed_launch()
    if handed is None:
        return plan_launch(
            profile, overrides, critic_warmup_iterations, run_name, resume=resume, resume_from=resume_from
        )
    asked = LaunchParameters(profile, tuple(overrides or ()), critic_warmup_iterations, run_name, resume, resume_from)
    if handed.parameters is not None and handed.parameters != asked:
        raise RuntimeError(f"the ppo flow was called with {asked} but handed a launch planned from {handed.parameters}")
    return handed
