"""Long-lived Ray actors, one per role, created once per flow run.

The wrapper adds nothing to a role body but placement: the same class runs
in-process (tests, the overhead benchmark) or as an actor.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import ray

from configs.schema import PPOConfig
from contracts.faults import RepeatsOnRerun, repeats_on_rerun
from contracts.timeouts import startup_timeout as startup_timeout  # where the flow asks for it
from placement.plan import SHARDED_ROLES, plan_placement
from placement.ray_lowering import LoweredPlacement, lower_placement, release_placement
from placement.role_placement import role_placements
from processes.dead_actors import kill_quietly
from processes.engine_pool import WATCH_GROUP, EngineLaunch, EnginePool
from roles.bodies import ROLE_CLASSES

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from roles.critic_role import CriticRole
    from roles.data_role import DataRole
    from roles.policy_role import PolicyRole
    from roles.reference_role import ReferenceRole
    from roles.replay_role import ReplayRole
    from roles.reward_role import RewardRole
    from roles.rollout_role import RolloutRole


@dataclass(frozen=True)
class RoleHandles:
    """One actor group per role (S-RUN-5). The fields are each group's rank 0, the
    only rank of most roles; a data-parallel trainer's other ranks and the rollout's
    other engines are in `peers`."""

    data: ActorHandle[DataRole]
    rollout: ActorHandle[RolloutRole]
    reward: ActorHandle[RewardRole]
    replay: ActorHandle[ReplayRole]
    reference: ActorHandle[ReferenceRole]
    policy: ActorHandle[PolicyRole]
    critic: ActorHandle[CriticRole] | None = None  # None: a critic-free estimator (S-OPT-2)
    peers: dict[str, tuple[ActorHandle, ...]] = field(default_factory=dict)
    ready_seconds: dict[str, float] = field(default_factory=dict)  # actor label -> seconds from launch to ready
    # Several engines: the one actor every engine call goes through (processes/engine_pool.py).
    pool: ActorHandle[EnginePool] | None = None

    def items(self) -> list[tuple[str, Any]]:
        """(role, rank-0 handle) for every role."""
        return [
            (f.name, getattr(self, f.name)) for f in fields(self)
            if f.name not in ("peers", "ready_seconds", "pool") and getattr(self, f.name) is not None
        ]

    def ranks(self, role: str) -> list[Any]:
        """Every rank of one role, rank 0 first; none for a role this run does not start."""
        first = getattr(self, role)
        return [] if first is None else [first, *self.peers.get(role, ())]

    # Each rank group typed by its role, so a reader of the iteration program reaches
    # PolicyRole.train_batch from `rank.train_batch`.
    def policy_ranks(self) -> list[ActorHandle[PolicyRole]]:
        return self.ranks("policy")

    def critic_ranks(self) -> list[ActorHandle[CriticRole]]:
        return self.ranks("critic")

    def reference_ranks(self) -> list[ActorHandle[ReferenceRole]]:
        return self.ranks("reference")

    def engines(self) -> list[ActorHandle[RolloutRole] | ActorHandle[EnginePool]]:
        """What the iteration program hands the rollout's verbs (generate, load_weights,
        evaluate) to: the run's one engine, or the pool of its several (S-ELASTIC-1)."""
        return [self.pool if self.pool is not None else self.rollout]


def actor_name(role: str, rank: int) -> str:
    return role if rank == 0 else f"{role}-rank{rank}"


_live_placements: list[LoweredPlacement] = []  # reserved by start_role_actors, released by stop_role_actors


def ray_namespace(config: PPOConfig) -> str:
    return f"ppo-{config.job.name}"


@dataclass
class LaunchedActors:
    """Role actors created but not yet awaited: their processes import and load
    their models while the caller does something else."""

    groups: dict[str, list[Any]]
    launched_at: float
    pool: ActorHandle[EnginePool] | None = None  # a run with several engines: their pool, launched beside them


def discard_launched(launched: LaunchedActors) -> None:
    """Actors launched for a flow that never took them (it was refused): kill them."""
    _kill_launched(launched)
    while _live_placements:
        release_placement(_live_placements.pop())


def actor_label(role: str, rank: int, ranks: int) -> str:
    """How messages name one actor: the role, and its rank when the role has several."""
    return role if ranks == 1 else f"{role} rank {rank}"


def start_role_actors(
    config: PPOConfig, ready_timeout_s: float | None = None, launched: LaunchedActors | None = None
) -> RoleHandles:
    """Every role actor (every rank of a data-parallel trainer), each waited for until
    it has loaded its model; then each trainer's process group. Starts the actors
    `launched` ahead for this run (flows/launch.py), else launches them. An actor that
    fails to start, or is not ready within `ready_timeout_s`, fails the start-up naming
    its role."""
    launched = launched or launch_role_actors(config)
    groups = launched.groups
    try:
        ready_seconds = wait_until_ready(groups, ready_timeout_s, launched.launched_at)
        if launched.pool is not None:  # after the engines: it asks each where it runs
            _wait_for_pool(launched.pool, ready_timeout_s)
    except Exception:
        _kill_launched(launched)  # none of them may linger on a standing cluster
        raise
    for role, ranks in groups.items():
        if role in SHARDED_ROLES and len(ranks) > 1:
            address = ray.get(ranks[0].rendezvous_address.remote())
            ray.get([handle.join_data_parallel.remote(address, rank, len(ranks)) for rank, handle in enumerate(ranks)])
    return RoleHandles(
        **{role: ranks[0] for role, ranks in groups.items()},
        peers={role: tuple(ranks[1:]) for role, ranks in groups.items() if len(ranks) > 1},
        ready_seconds=ready_seconds,
        pool=launched.pool,
    )


def _wait_for_pool(pool: Any, ready_timeout_s: float | None) -> None:
    try:
        ray.get(pool.ready.remote(), timeout=ready_timeout_s)
    except Exception as error:
        raise ActorStartupError(f"the rollout engine pool failed to start: {startup_cause(error)}") from error


def launch_role_actors(config: PPOConfig) -> LaunchedActors:
    """Create every role actor without waiting for any. A leftover actor of the same
    run name (a killed run whose lock this run took over) is replaced: its state may
    be ahead of the last commit."""
    launched_at = time.perf_counter()
    namespace = ray_namespace(config)
    kill_run_actors(config.job.name)
    # Device groups become placement groups on a GPU run, nothing on CPU (S-RUN-4).
    plan = plan_placement(config)
    lowered = lower_placement(plan, namespace=namespace)
    _live_placements.append(lowered)
    placements = role_placements(plan)  # the one decision every role is built from
    groups: dict[str, list[Any]] = {}
    engine_launches: list[EngineLaunch] = []
    for role, cls in ROLE_CLASSES.items():
        if role not in placements:
            continue  # a role this run's plan does not start (a critic-free estimator's critic)
        arguments = [(config, placement) for placement in placements[role]]
        groups[role] = [
            _launch_actor(role, rank, len(arguments), cls, args, lowered.actor_options(role, rank), namespace)
            for rank, args in enumerate(arguments)
        ]
        if role == "rollout":
            engine_launches = [
                EngineLaunch(rank, cls, args, lowered.actor_options(role, rank), namespace)
                for rank, args in enumerate(arguments)
            ]
    pool = None
    if len(engine_launches) > 1:  # S-ELASTIC-1: a host actor, where the host roles run
        pool = ray.remote(concurrency_groups={WATCH_GROUP: 1})(EnginePool).options(
            name="rollout-pool", namespace=namespace, max_restarts=0, **lowered.actor_options("data")
        ).remote(config, groups["rollout"], engine_launches)
    return LaunchedActors(groups, launched_at, pool)


class ActorSource(Protocol):
    """Where a run's role actors come from and where they go when the run ends. The
    default starts a fresh named actor per role and rank and kills it afterwards; a test
    session that runs many short runs installs one that reuses processes
    (`actors_from`)."""

    def launch(
        self, role: str, cls: type, args: tuple[Any, ...], options: dict[str, Any], name: str, namespace: str,
        joins_a_group: bool,
    ) -> Any: ...

    def end(self, role: str, handle: Any, keep: bool) -> None: ...


class FreshActors:
    def launch(
        self, role: str, cls: type, args: tuple[Any, ...], options: dict[str, Any], name: str, namespace: str,
        joins_a_group: bool,
    ) -> Any:
        return ray.remote(cls).options(name=name, namespace=namespace, max_restarts=0, **options).remote(*args)

    def end(self, role: str, handle: Any, keep: bool) -> None:
        kill_quietly(handle)


@dataclass
class _SourceSlot:
    """Where this process's runs take their actors from: one slot, swapped by
    `actors_from` and read at every launch (a thread-independent setting, unlike a
    context variable, since Prefect may start the actors from another thread)."""

    source: ActorSource


_slot = _SourceSlot(FreshActors())


@contextmanager
def actors_from(source: ActorSource) -> Iterator[ActorSource]:
    """Runs started inside take their role actors from `source` and hand them back to it."""
    previous, _slot.source = _slot.source, source
    try:
        yield source
    finally:
        _slot.source = previous


def actor_source() -> ActorSource:
    return _slot.source


def _launch_actor(
    role: str, rank: int, ranks: int, cls: type, args: tuple[Any, ...], options: dict[str, Any], namespace: str
) -> Any:
    joins_a_group = role in SHARDED_ROLES and ranks > 1
    return _slot.source.launch(role, cls, args, options, actor_name(role, rank), namespace, joins_a_group)


class ActorStartupError(RuntimeError):
    """A role actor failed in its constructor or never became ready; `repeats` as
    StageFailed's (a constructor that refused the user's data or code)."""

    def __init__(self, message: str, *, repeats: bool = False):
        super().__init__(message)
        self.repeats = repeats


def startup_repeats(error: BaseException) -> bool:
    """Whether a constructor's failure would repeat on a rerun (contracts/faults.py).
    Ray hands the exception object over for a failed call, but for a constructor often
    only its text: then the raised class's name is looked up among those that repeat."""
    from ray.exceptions import RayTaskError

    cause = error.cause if isinstance(error, RayTaskError) and error.cause is not None else error
    if repeats_on_rerun(cause):
        return True
    raised = startup_cause(error).split(":", 1)[0].rsplit(".", 1)[-1]
    return raised in _subclass_names(RepeatsOnRerun)


def _subclass_names(base: type) -> set[str]:
    names: set[str] = set()
    for subclass in base.__subclasses__():
        names |= {subclass.__name__} | _subclass_names(subclass)
    return names


def startup_cause(error: BaseException) -> str:
    """The actor's own error in one line (`OSError: no model at ...`), not Ray's
    wrapper with the remote traceback: it ends the command's output."""
    from ray.exceptions import RayTaskError

    cause = error.cause if isinstance(error, RayTaskError) and error.cause is not None else error
    text = str(cause).strip().splitlines()
    # An actor whose constructor raised is reported dead, its constructor's traceback
    # inside: the raised exception is the first unindented line after the last frame,
    # whatever its class is called (`pyarrow.lib.ArrowInvalid: ...` too).
    frames = [index for index, line in enumerate(text) if re.match(r'^\s+File "', line)]
    after_frames = [line.strip() for line in text[frames[-1] + 1:] if line.strip() and not line[0].isspace()] \
        if frames else []
    if after_frames:
        return after_frames[0]
    lines = [line.strip() for line in text if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line)]
    if raised:
        return raised[-1]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def wait_until_ready(
    groups: dict[str, list[Any]], timeout_s: float | None, launched_at: float | None = None
) -> dict[str, float]:
    """Seconds from the actors' launch until each has built its role (imports, model
    load), as they come in; the start-up's breakdown for users and bench/startup.py."""
    started = time.perf_counter() if launched_at is None else launched_at
    labels = {
        handle.ready.remote(): actor_label(role, rank, len(ranks))
        for role, ranks in groups.items()
        for rank, handle in enumerate(ranks)
    }
    seconds: dict[str, float] = {}
    waiting = list(labels)
    while waiting:
        left = None if timeout_s is None else max(0.0, timeout_s - (time.perf_counter() - started))
        done, waiting = ray.wait(waiting, num_returns=1, timeout=left)
        if not done:
            late = ", ".join(sorted(labels[ref] for ref in waiting))
            raise ActorStartupError(f"role actors not ready within {timeout_s:g} s of their launch: {late}")
        try:
            ray.get(done[0])
        except Exception as error:
            raise ActorStartupError(
                f"{labels[done[0]]} failed to start: {startup_cause(error)}", repeats=startup_repeats(error)
            ) from error
        seconds[labels[done[0]]] = time.perf_counter() - started
    return seconds


def _kill_launched(launched: LaunchedActors) -> None:
    if launched.pool is not None:
        kill_quietly(launched.pool)
    for role, ranks in launched.groups.items():
        for handle in ranks:
            _end_actor(role, handle, keep=False)


def _end_actor(role: str, handle: Any, keep: bool) -> None:
    """Kill a run's actor, or hand it back to the source that keeps processes."""
    _slot.source.end(role, handle, keep)


def stop_role_actors(handles: RoleHandles | None) -> None:
    """Kill the run's actors, or hand the live ones back to an `ActorSource` that
    keeps processes for the next run."""
    if handles is not None and handles.pool is not None:
        kill_quietly(handles.pool)  # its replacement engines go with it (Ray fate-shares them with their owner)
    for role, _ in handles.items() if handles is not None else []:
        for handle in handles.ranks(role):
            _end_actor(role, handle, keep=True)
    # Also when start-up failed half way (handles is None): free the reserved GPUs.
    while _live_placements:
        release_placement(_live_placements.pop())


def kill_run_actors(run_name: str) -> list[str]:
    """Remove leftover actors of a named run (every rank) from a Ray cluster."""
    from ray.util import list_named_actors

    namespace = f"ppo-{run_name}"
    killed = []
    for entry in list_named_actors(all_namespaces=True):
        if entry.get("namespace") != namespace:
            continue
        try:
            ray.kill(ray.get_actor(entry["name"], namespace=namespace))
            killed.append(entry["name"])
        except ValueError:  # gone meanwhile
            continue
    return sorted(killed)  # the cluster lists them in no fixed order
