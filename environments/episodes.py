"""Multi-turn episodes over a rollout engine (S-ENV-1, S-ENV-2, S-ENV-3).

Every episode of a batch advances in lock step, one assistant turn at a time: the
engine generates the turn for every episode still going, then the environments step
concurrently (a slow tool costs one wait per turn, not one per episode). Each turn
continues from the exact token ids already sampled; only the environment's messages
are tokenised (`chat_tokens`). The result is laid out as one response per episode:
assistant tokens are actions (sampled, trained on), observation tokens are context.

Deterministic given the rows, their seeds and the generation seed: every turn's
sampling seed is derived from the generation seed and the turn, and environments are
stepped in parallel but their answers gathered in batch order.

Calls are read, and tool answers rendered, in the run's tool-call format
(`rl.env.tool_call_format`, environments/tool_call_formats.py; S-BYO-5).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch

from contracts.faults import RepeatsOnRerun
from contracts.trajectory import Transcript
from data.packing import PackedPrompts
from environments.chat_tokens import ObservationEncoder, opening_ids
from environments.preflight import opening_too_long, template_renders_tool_messages
from environments.protocol import EnvRow, MalformedEnvironmentOutput, Reset, Step, checked_reset, checked_step
from configs.tool_call_format_names import DEFAULT_FORMAT
from environments.tool_call_formats import ToolCallFormat, format_named
from environments.tool_calls import ToolCall, assistant_message


class EnvironmentFailed(RuntimeError, RepeatsOnRerun):
    """An environment raised, hung or answered something unusable (`rl.env.on_error=fail`)."""


class OpeningTooLong(EnvironmentFailed):
    """An episode's opening leaves the model too few positions for `rl.env.max_episode_tokens`
    (S-BYO-5); raised whatever `rl.env.on_error` says: it is the config, not one episode."""


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_turn_tokens: int
    max_episode_tokens: int
    step_timeout_seconds: float
    on_error: Literal["fail", "end"]
    max_concurrency: int
    factory_name: str  # for error messages: which environment


@dataclass
class _Episode:
    row: EnvRow
    seed: int
    env: Any = None
    context: list[int] = field(default_factory=list)     # every token so far, the opening included
    response: list[int] = field(default_factory=list)    # after the opening
    actions: list[float] = field(default_factory=list)   # 1.0 on sampled tokens
    logprobs: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    last_answer: str = ""
    last_written: str = ""  # the last turn as the tool-call format reads it
    last_calls: list[ToolCall] = field(default_factory=list)  # the calls read from it
    done: bool = False
    cut: bool = False
    failed: bool = False
    turns: int = 0
    tool_calls: int = 0
    parse_errors: int = 0

    def append(self, ids: list[int], action: bool, logprobs: list[float] | None = None) -> None:
        self.context += ids
        self.response += ids
        self.actions += [1.0 if action else 0.0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.rewards += [0.0] * len(ids)


@dataclass(frozen=True)
class EpisodeBatch:
    """One row per episode; shapes (b, p) for the opening, (b, r) for the rest."""

    prompt_ids: torch.Tensor      # left-padded
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor    # right-padded with the pad id
    response_mask: torch.Tensor   # 1.0 on every token after the opening: turns and observations
    action_mask: torch.Tensor     # 1.0 on the tokens the engine sampled
    logprobs: torch.Tensor        # sampling log-probs on actions, 0 elsewhere
    turn_rewards: torch.Tensor    # each turn's reward on its last sampled token
    completions: list[str]        # each episode's last assistant turn
    transcripts: list[Transcript]  # what each episode said, its turns, calls and how it ended
    metrics: dict[str, float]


def _plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": str(m["role"]), "content": str(m.get("content", ""))} for m in messages]


class EpisodeRunner:
    """`positions`: the model's context (config.json), which every opening plus
    `max_episode_tokens` must fit; None where the config sets none."""

    def __init__(
        self, tokenizer, make_env: Callable[[], Any], limits: EpisodeLimits,
        tool_format: ToolCallFormat | None = None, positions: int | None = None,
    ):
        self.tokenizer = tokenizer
        self.make_env = make_env
        self.limits = limits
        self.tool_format = tool_format or format_named(DEFAULT_FORMAT)
        self.positions = positions
        # As pre-flight checked, for a model built since.
        template_renders_tool_messages(tokenizer, self.tool_format)
        self.observations = ObservationEncoder(tokenizer, tokenizer.eos_token)
        self.eos = tokenizer.eos_token_id
        # The format's other turn ends that this tokenizer has as single tokens (Llama's <|eom_id|>).
        vocabulary = tokenizer.get_vocab()
        self.stops = tuple(vocabulary[token] for token in self.tool_format.turn_ends
                           if token in vocabulary and vocabulary[token] != self.eos)
        self.turn_ends = {self.eos, *self.stops}
        self.pad = tokenizer.pad_token_id

    def run(
        self, engine, rows: list[EnvRow], seeds: list[int], *, temperature: float, generation_seed: int, greedy: bool
    ) -> EpisodeBatch:
        episodes = [_Episode(row, seed) for row, seed in zip(rows, seeds)]
        started = time.perf_counter()
        waited = 0.0
        opened = self._concurrently(episodes, 0, lambda e: checked_reset(self._reset(e)))
        for episode, reset in zip(episodes, opened):
            if isinstance(reset, Reset):
                episode.context = opening_ids(self.tokenizer, reset.messages, reset.tools)
                episode.messages = _plain_messages(reset.messages)
            else:  # on_error=end: an episode that never opened samples one turn from an empty one
                episode.context = opening_ids(self.tokenizer, [{"role": "user", "content": ""}], None)
                episode.done = False
            self._check_opening_fits(episode)
        for turn in range(1, self.limits.max_turns + 1):
            going = [e for e in episodes if not e.done]
            if not going:
                break
            self._sample_turn(engine, going, turn, temperature, generation_seed, greedy)
            for episode in going:
                episode.done = episode.done or episode.failed
            stepping = [e for e in going if not e.done]
            step_started = time.perf_counter()
            answers = self._concurrently(stepping, turn, self._step)
            waited += time.perf_counter() - step_started
            for episode, step in zip(stepping, answers):
                self._observe(episode, step, turn)
        return self._batch(episodes, time.perf_counter() - started, waited)

    def _check_opening_fits(self, episode: _Episode) -> None:
        """S-BYO-5: the pre-flight calls no user environment (S-SEC-3), so the opening (with
        the tools' schemas) is measured here, the first time it exists."""
        budget, opening = self.limits.max_episode_tokens, len(episode.context)
        if self.positions is None or opening + budget <= self.positions:
            return
        where = episode.row.source or f"row {episode.row.row_id}"
        raise OpeningTooLong(opening_too_long(
            f"row {episode.row.row_id} ({where})", self.limits.factory_name, opening, budget, self.positions,
            self.limits.max_turn_tokens,
        ))

    # --- environment calls ---------------------------------------------------------

    def _reset(self, episode: _Episode) -> Any:
        episode.env = self.make_env()
        return episode.env.reset(episode.row, episode.seed)

    def _step(self, episode: _Episode) -> Step:
        parsed = self.tool_format.parse(episode.last_written)
        episode.last_calls = [] if parsed.errors else parsed.tool_calls  # an error answers the turn, no call
        episode.tool_calls += len(parsed.tool_calls)
        if parsed.errors:
            # The model learns the format from being told, not from a crash (counted).
            episode.parse_errors += len(parsed.errors)
            text = "; ".join(parsed.errors)
            return Step([{"role": "tool", "content": f"error: the tool call could not be read: {text}"}], 0.0, False)
        return checked_step(episode.env.step(assistant_message(parsed)))

    def _concurrently(self, episodes: list[_Episode], turn: int, call: Callable[[_Episode], Any]) -> list[Any]:
        """`call` on every episode at once (at most `max_concurrency` running); each
        answer in batch order, or None for an episode that failed under `on_error=end`
        (a failure under `fail` raises, naming it). Daemon threads: a step that never
        returns is abandoned, and cannot keep the process from exiting."""
        outcomes: list[tuple[bool, Any] | None] = [None] * len(episodes)
        gate = threading.BoundedSemaphore(self.limits.max_concurrency)

        def work(index: int) -> None:
            with gate:
                try:
                    outcomes[index] = (True, call(episodes[index]))
                except BaseException as error:  # reported below with the row and turn
                    outcomes[index] = (False, error)

        threads = [threading.Thread(target=work, args=(i,), daemon=True, name=f"env-{i}") for i in range(len(episodes))]
        for thread in threads:
            thread.start()
        # Queued calls start late when there are more episodes than workers.
        rounds = -(-len(episodes) // self.limits.max_concurrency) if episodes else 0
        deadline = time.monotonic() + self.limits.step_timeout_seconds * max(1, rounds)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        answers = []
        for episode, outcome in zip(episodes, outcomes):
            what = "reset" if turn == 0 else f"turn {turn}"
            error: BaseException | None = None
            if outcome is None:
                problem = f"did not answer within rl.env.step_timeout_seconds={self.limits.step_timeout_seconds:g}"
            elif not outcome[0]:
                error = outcome[1]
                kind = "returned" if isinstance(error, MalformedEnvironmentOutput) else "raised"
                problem = f"{kind} {type(error).__name__}: {error}"
            else:
                answers.append(outcome[1])
                continue
            where = episode.row.source or f"row {episode.row.row_id}"
            message = (
                f"environment {self.limits.factory_name} (rl.env.factory) {problem}, at {what} of the episode of "
                f"row {episode.row.row_id} ({where})"
            )
            if self.limits.on_error == "fail":
                raise EnvironmentFailed(message) from error
            episode.failed = episode.done = True
            answers.append(None)
        return answers

    # --- turns -----------------------------------------------------------------------

    def _sample_turn(
        self, engine, going: list[_Episode], turn: int, temperature: float, generation_seed: int, greedy: bool
    ) -> None:
        budgets = [self.limits.max_episode_tokens - len(e.response) for e in going]
        width = max(len(e.context) for e in going)
        input_ids = torch.full((len(going), width), self.pad, dtype=torch.long)
        attention_mask = torch.zeros((len(going), width), dtype=torch.long)
        for i, episode in enumerate(going):
            input_ids[i, width - len(episode.context):] = torch.tensor(episode.context)
            attention_mask[i, width - len(episode.context):] = 1
        result = engine.generate(
            PackedPrompts(input_ids, attention_mask),
            max_new_tokens=min(self.limits.max_turn_tokens, max(budgets)),
            temperature=temperature,
            seed=generation_seed + 104_729 * turn,
            greedy=greedy,
            **({"stop_token_ids": self.stops} if self.stops else {}),
        )
        for i, (episode, budget) in enumerate(zip(going, budgets)):
            kept = result.response_mask[i].bool()
            ids = result.response_ids[i][kept].tolist()[: min(self.limits.max_turn_tokens, budget)]
            logprobs = result.logprobs[i][kept].tolist()[: len(ids)]
            episode.append(ids, action=True, logprobs=logprobs)
            episode.turns = turn
            ended = bool(ids) and ids[-1] in self.turn_ends
            text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
            episode.last_answer = text
            # A format whose call marker is a special token (Mistral's) reads the turn with it.
            episode.last_written = (
                self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
                if self.tool_format.reads_special_tokens else text
            )
            episode.messages.append({"role": "assistant", "content": episode.last_written})
            if not ended:  # the turn ran into a token limit: nothing to step on
                episode.done = episode.cut = True

    def _observe(self, episode: _Episode, step: Step | None, turn: int) -> None:
        if step is None:  # failed under on_error=end: the episode ends with reward 0
            episode.rewards = [0.0] * len(episode.rewards)
            return
        # The turn's reward sits on its last sampled token, where it was earned.
        episode.rewards[-1] += step.reward
        if step.done:
            episode.done = True
            return
        if turn == self.limits.max_turns:
            episode.done = episode.cut = True
            return
        ids = self.observations.ids(self.tool_format.rendered_answers(step.messages, episode.last_calls))
        if len(episode.response) + len(ids) >= self.limits.max_episode_tokens:
            episode.done = episode.cut = True  # no room left for an answer after this observation
            return
        episode.append(ids, action=False)
        episode.messages += _plain_messages(step.messages)

    # --- layout ------------------------------------------------------------------------

    def _batch(self, episodes: list[_Episode], seconds: float, waited: float) -> EpisodeBatch:
        p = max(len(e.context) - len(e.response) for e in episodes)
        r = max(max(len(e.response) for e in episodes), 1)
        b = len(episodes)
        prompt_ids = torch.full((b, p), self.pad, dtype=torch.long)
        prompt_mask = torch.zeros((b, p), dtype=torch.long)
        response_ids = torch.full((b, r), self.pad, dtype=torch.long)
        response_mask = torch.zeros((b, r))
        action_mask = torch.zeros((b, r))
        logprobs = torch.zeros((b, r))
        rewards = torch.zeros((b, r))
        for i, e in enumerate(episodes):
            opening = e.context[: len(e.context) - len(e.response)]
            prompt_ids[i, p - len(opening):] = torch.tensor(opening, dtype=torch.long)
            prompt_mask[i, p - len(opening):] = 1
            n = len(e.response)
            if n:
                response_ids[i, :n] = torch.tensor(e.response, dtype=torch.long)
                response_mask[i, :n] = 1.0
                action_mask[i, :n] = torch.tensor(e.actions)
                logprobs[i, :n] = torch.tensor(e.logprobs)
                rewards[i, :n] = torch.tensor(e.rewards)
        count = float(max(b, 1))
        metrics = {
            "env/turns_mean": sum(e.turns for e in episodes) / count,
            "env/tool_calls_mean": sum(e.tool_calls for e in episodes) / count,
            "env/errors": float(sum(e.failed for e in episodes)),
            "env/tool_call_parse_errors": float(sum(e.parse_errors for e in episodes)),
            "env/cut_fraction": sum(e.cut for e in episodes) / count,
            "env/episode_seconds": seconds,
            "env/step_wait_seconds": waited,
        }
        return EpisodeBatch(
            prompt_ids, prompt_mask, response_ids, response_mask, action_mask, logprobs, rewards,
            completions=[e.last_answer for e in episodes],
            transcripts=[
                Transcript(messages=e.messages, turns=e.turns, tool_calls=e.tool_calls, cut=e.cut, failed=e.failed)
                for e in episodes
            ],
            metrics=metrics,
        )
