"""A generated and scored batch with the summaries of the stages that made it: what an
iteration trains on, and, one step off, what a boundary holds for the next iteration
(S-ASYNC-3). One shape in three places: the flow holds it as handles to values still
being computed, the replay role and the boundary's file as the values. Between them it
travels as its `parts()`, in that order, because Ray resolves handles only at the top
level of a call's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

V = TypeVar("V")


@dataclass
class ScoredBatch(Generic[V]):
    trajectory: V
    data_summary: V
    rollout_summary: V
    reward_summary: V

    PARTS: ClassVar[int] = 4

    def parts(self) -> tuple[V, V, V, V]:
        return (self.trajectory, self.data_summary, self.rollout_summary, self.reward_summary)

    def summaries(self) -> dict[str, V]:
        """The stage summaries by stage, as the metrics row and the boundary's file name them."""
        return {"data": self.data_summary, "rollout": self.rollout_summary, "reward": self.reward_summary}

    @classmethod
    def from_summaries(cls, trajectory: Any, summaries: dict[str, Any]) -> "ScoredBatch[Any]":
        return cls(trajectory, summaries["data"], summaries["rollout"], summaries["reward"])
