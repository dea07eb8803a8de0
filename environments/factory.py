"""The run's environment factory and episode seeds (S-ENV-1, S-ENV-3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from configs.callables import import_callable
from configs.schema import PPOConfig
from contracts.faults import RepeatsOnRerun
from contracts.trajectory import PromptBatch
from environments.episodes import EpisodeLimits, EpisodeRunner
from environments.protocol import EnvRow
from environments.tool_call_formats import format_named
from files.model_folder import POSITIONS, cached_hub_file, config_value


class EnvironmentConfigError(ValueError, RepeatsOnRerun):
    pass


def environment_factory(config: PPOConfig) -> Callable[[], Any]:
    """A callable making one environment per episode, refused by key when it cannot
    be imported or is outside the trusted modules an override may name."""
    env = config.rl.env
    assert env is not None
    build = import_callable(
        env.factory, key="rl.env.factory", error=EnvironmentConfigError, trusted=config.job.trusted_modules
    )
    kwargs = dict(env.factory_kwargs)
    return lambda: build(**kwargs)


def episode_runner(config: PPOConfig, tokenizer, model_path: str | None = None) -> EpisodeRunner:
    """The run's episode loop, in its tool-call format, checking each opening against the
    positions of the model at `model_path` (default `model.path`; S-BYO-5)."""
    env = config.rl.env
    assert env is not None
    limits = EpisodeLimits(
        max_turns=env.max_turns,
        max_turn_tokens=env.max_turn_tokens,
        max_episode_tokens=env.max_episode_tokens,
        step_timeout_seconds=env.step_timeout_seconds,
        on_error=env.on_error,
        max_concurrency=env.max_concurrency,
        factory_name=env.factory,
    )
    return EpisodeRunner(
        tokenizer, environment_factory(config), limits, format_named(env.tool_call_format),
        model_positions(model_path or config.model.path),
    )


def model_positions(model_path: str) -> int | None:
    """The model's context in positions from its config.json; None where it says none."""
    local = Path(model_path) / "config.json"
    source = str(local) if local.is_file() else cached_hub_file(model_path, "config.json")  # a hub id, loaded
    if source is None:
        return None
    positions = config_value(json.loads(Path(source).read_text()), *POSITIONS)
    return positions if isinstance(positions, int) else None


def episode_rows(prompts: PromptBatch) -> list[EnvRow]:
    sources = prompts.sources or [""] * len(prompts.prompts)
    return [
        EnvRow(prompt, reference, dict(metadata), row_id, source)
        for prompt, reference, metadata, row_id, source in zip(
            prompts.prompts, prompts.references, prompts.metadata, prompts.row_ids, sources
        )
    ]


def episode_seeds(
    job_seed: int, iteration: int, row_ids: list[int], first_position: int, stream: int,
    group_ids: list[int] | tuple[int, ...] = (),
) -> list[int]:
    """One seed per episode, from the run's seed, the iteration, the row and its prompt's
    place in the whole batch (not the shard): an engine that regenerates a lost shard, or
    a resumed run, gives each environment the seed it had (S-ENV-3). `stream` keeps
    training and evaluation episodes apart. With several samples per prompt the place is
    the row's group id (PromptBatch.group_ids), so a prompt's samples face one task (S-OPT-2);
    without, row i's is `first_position + i`."""
    places = list(group_ids) or [first_position + i for i in range(len(row_ids))]
    return [
        ((((job_seed * 1_000_003 + iteration) * 1_000_033 + row_id) * 8_191 + place) * 4 + stream) % (2**63 - 1)
        for row_id, place in zip(row_ids, places)
    ]
