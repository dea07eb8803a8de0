"""What a pool of rollout engines reports about the engine faults it survived, with the
batch it generated (processes/engine_pool.py): two metrics, and the events as records
(which engine, which shard, how many seconds, regenerated on which engine) that the
rollout stage turns into its task run's log lines (then dropped from the record).

The records travel as plain data (`as_event`): one step off, the summary is kept as JSON
with the in-flight batch a boundary holds (S-ASYNC-3) and logged when that batch's row is.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

LOST_KEY = "fault/rollout_engines_lost"
REPLACE_SECONDS_KEY = "fault/rollout_replace_seconds"
FAULT_EVENTS = "fault/rollout_events"  # [as_event(record), ...]: logged, never a metric


@dataclass
class Regeneration:
    """A lost engine's shard, generated again on a survivor with its own index and version."""

    iteration: int
    shard: int
    shards: int
    on: int  # the surviving engine
    into_shard_s: float  # how long the shard had been under way when its engine was lost
    done_after_s: float | None = None  # how long the survivor took, once it is done

    def describe(self) -> str:
        text = (
            f"iteration {self.iteration}: shard {self.shard} of {self.shards} generated again on rollout engine "
            f"{self.on} ({self.into_shard_s:.1f} s into the shard)"
        )
        return text if self.done_after_s is None else f"{text}, done after {self.done_after_s:.1f} s more"


@dataclass
class EngineLost:
    """A rollout engine killed (its process gone, or no answer in time) and replaced."""

    engine: int
    node: str
    why: str
    regenerated: list[Regeneration] = field(default_factory=list)
    level = logging.WARNING

    def what(self) -> str:
        """The engine and why it counts as lost, as the log line and a failed stage both say it."""
        return f"rollout engine {self.engine} on {self.node}: {self.why}"

    def describe(self) -> str:
        return "; ".join([f"lost {self.what()}", *(r.describe() for r in self.regenerated)])


@dataclass
class EngineReplaced:
    """A replacement engine in its lost predecessor's place, with the weights it took."""

    engine: int
    node: str
    policy_version: int
    behind: bool  # it could not read `policy_version` (the policy staged a newer one): serves from the next load
    seconds: float  # its own start-up and weight load
    waited: float  # how long the pool's call waited for it
    level = logging.INFO

    def describe(self) -> str:
        serving = (
            f"waits for the next weight sync (policy_version {self.policy_version} was replaced before it could "
            "read it)" if self.behind else f"is serving policy_version {self.policy_version}"
        )
        return (
            f"replacement rollout engine {self.engine} {serving} on {self.node} (started in {self.seconds:.1f} s, "
            f"weights included; this call waited {self.waited:.1f} s for it)"
        )


def as_event(record: EngineLost | EngineReplaced) -> dict[str, Any]:
    """A record as JSON-ready data, named by its kind."""
    return {"kind": type(record).__name__, **asdict(record)}


def describe_event(event: dict[str, Any] | list[str]) -> tuple[int, str]:
    """The log level and line of one event of `FAULT_EVENTS`."""
    if isinstance(event, list):  # [level, message]: the form boundaries of earlier versions hold
        return (logging.WARNING if event[0] == "warning" else logging.INFO), event[1]
    fields = {key: value for key, value in event.items() if key != "kind"}
    record: EngineLost | EngineReplaced
    if event["kind"] == EngineLost.__name__:
        record = EngineLost(**{**fields, "regenerated": [Regeneration(**r) for r in fields["regenerated"]]})
    else:
        record = EngineReplaced(**fields)
    return record.level, record.describe()
