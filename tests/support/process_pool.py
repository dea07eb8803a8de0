"""Role actor processes kept alive from one run to the next of the test session, an
`ActorSource` (processes/actors.py) the tests install with `keep_role_processes`.

Most of what starting a run costs on a small machine is its seven actor processes
importing torch and transformers, and Ray never hands a used worker to a new actor. The
test session runs many short runs one after another, so it keeps each finished run's
processes and builds the next run's role bodies in them: the body is built by the role's own constructor with the same
arguments a fresh process gets, after the previous body was dropped, so nothing of the
previous run's state survives except what a process caches by design (imported
modules). Off unless a driver turns it on (`keep_role_processes`); the CLI and
deployment runs always start fresh processes.

Only processes that are plain to reuse are kept: an actor with no reservation (one
node, no placement group, no GPU) that never joins a process group (a trainer of
several ranks does; several rollout engines do not), that drops its body within
`discard_timeout_s` when its run ends. A run that failed keeps its live processes too:
the body it half-updated is dropped like any other, and a dead, hung or busy process
does not answer in time and is killed. A process whose body failed to build is killed.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Any, Iterator

import ray

from processes.actors import FreshActors, actor_source, actors_from
from processes.dead_actors import kill_quietly

_reusable_classes: dict[type, type] = {}


def reusable_class(role_class: type) -> type:
    """`role_class` with two more actor methods: `rebuild(*args)` drops the current
    body and runs the role's constructor again in the same process, and `discard()`
    drops the body (its model, optimizer, held batches) while the process waits."""
    if role_class in _reusable_classes:
        return _reusable_classes[role_class]

    def rebuild(self: Any, *args: Any) -> None:
        _drop_body(self)
        try:
            role_class.__init__(self, *args)
        except BaseException as error:
            self.__dict__["_rebuild_error"] = error
            raise

    def ready(self: Any) -> Any:
        error = self.__dict__.get("_rebuild_error")
        if error is not None:  # `ready` is how start-up learns a body failed to build
            raise error
        return role_class.ready(self)

    def discard(self: Any) -> bool:
        _drop_body(self)
        return True

    cls = type(
        f"Reusable{role_class.__name__}",
        (role_class,),
        {"rebuild": rebuild, "ready": ready, "discard": discard, "__doc__": role_class.__doc__},
    )
    _reusable_classes[role_class] = cls
    return cls


def _drop_body(instance: Any) -> None:
    instance.__dict__.clear()
    gc.collect()


@dataclass
class RoleProcessPool:
    """Idle role processes of one driver, by role. Handles of a live run are tracked
    so that only processes this pool made are ever given back to it."""

    idle: dict[str, list[Any]] = field(default_factory=dict)
    made: set[Any] = field(default_factory=set)  # actor ids of every process this pool created
    # (run namespace, actor name) -> the process serving it: a pooled actor has no Ray
    # name of its own, so this is how the run's actor is found (the fault tests do).
    serving: dict[tuple[str, str], Any] = field(default_factory=dict)
    reused: int = 0  # role bodies built in a kept process
    discard_timeout_s: float = 10.0  # longer than dropping a body takes; a hung process never answers

    @staticmethod
    def can_hold(actor_options: dict[str, Any], joins_a_group: bool) -> bool:
        """Unreserved actors that never join a process group. (Trainer ranks kept with
        their group torn down and re-formed hung in the next run's sharded save, so a
        trainer of several ranks always gets fresh processes.)"""
        return actor_options == {"num_cpus": 0} and not joins_a_group

    def launch(
        self, role: str, cls: type, args: tuple[Any, ...], options: dict[str, Any], name: str, namespace: str,
        joins_a_group: bool,
    ) -> Any:
        """A handle whose body is being built from `args`: in an idle process of this
        role when there is one, else in a new (unnamed) one that stands for the run's
        actor `name`. An actor the pool cannot hold is started fresh."""
        if not self.can_hold(options, joins_a_group):
            return FreshActors().launch(role, cls, args, options, name, namespace, joins_a_group)
        waiting = self.idle.get(role, [])
        if waiting:
            handle = waiting.pop()
            handle.rebuild.remote(*args)  # the next call (`ready`) runs after it: one caller, in order
            self.reused += 1
        else:
            handle = ray.remote(reusable_class(cls)).options(max_restarts=0, **options).remote(*args)
            self.made.add(handle)
        self.serving[(namespace, name)] = handle
        return handle

    def end(self, role: str, handle: Any, keep: bool) -> None:
        if self.owns(handle):
            self.release(role, handle, keep)
        else:
            kill_quietly(handle)

    def find(self, namespace: str, name: str) -> Any | None:
        return self.serving.get((namespace, name))

    def owns(self, handle: Any) -> bool:
        return handle in self.made

    def release(self, role: str, handle: Any, keep: bool) -> None:
        """A run is done with `handle`: keep its process for the next run (its body
        dropped) or kill it. A process that cannot drop its body in time is killed."""
        self.serving = {key: h for key, h in self.serving.items() if h != handle}
        if keep:
            try:
                ray.get(handle.discard.remote(), timeout=self.discard_timeout_s)
                self.idle.setdefault(role, []).append(handle)
                return
            except Exception:  # dead or stuck: not worth keeping
                pass
        self.made.discard(handle)
        with contextlib.suppress(Exception):
            ray.kill(handle)

    def close(self) -> None:
        for handles in self.idle.values():
            for handle in handles:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
        self.idle.clear()
        self.made.clear()
        self.serving.clear()


def active_pool() -> RoleProcessPool | None:
    source = actor_source()
    return source if isinstance(source, RoleProcessPool) else None


@contextlib.contextmanager
def keep_role_processes(pool: RoleProcessPool | None = None) -> Iterator[RoleProcessPool]:
    """Runs started inside this block take their role processes from `pool` and give
    the live ones back when they end. The pool outlives the block, so several blocks
    (several tests) can share it; whoever made it closes it."""
    with actors_from(pool or RoleProcessPool()) as source:
        yield source
