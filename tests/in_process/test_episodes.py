"""Multi-turn episodes on the real transformers engine and the tiny model (S-ENV-1..3):
each turn continues from the exact token ids sampled, observations are context,
rewards sit on the turn that earned them, environments step concurrently, and an
environment that fails is named with its row and turn."""

from __future__ import annotations

import time

import pytest
import torch

from environments.episodes import EnvironmentFailed, EpisodeLimits, EpisodeRunner, _Episode
from environments.protocol import EnvRow, Reset, Step
from models.model_io import load_tokenizer
from roles.rollout.hf_engine import HFEngine

FACTORY = "tests.in_process.test_episodes:CountingEnv"


class CountingEnv:
    """Answers every turn with a user message of digits; turn `reward_turn` earns 1."""

    def __init__(self, turns: int = 3, sleep: float = 0.0, raise_at: int | None = None, reward_turn: int = 2):
        self.turns, self.sleep, self.raise_at, self.reward_turn = turns, sleep, raise_at, reward_turn
        self.turn = 0

    def reset(self, row: EnvRow, seed: int) -> Reset:
        self.seed = seed
        return Reset([{"role": "user", "content": f"{row.prompt}{seed % 10}"}])

    def step(self, message: dict) -> Step:
        self.turn += 1
        time.sleep(self.sleep)
        if self.raise_at == self.turn:
            raise RuntimeError("the tool's database is down")
        reward = 1.0 if self.turn == self.reward_turn else 0.0
        if self.turn >= self.turns:
            return Step([], reward, True)
        return Step([{"role": "user", "content": str(self.turn) * 2}], reward, False)


class RecordingEngine(HFEngine):
    """The real engine; every turn's inputs and sampled ids kept for the assertions."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def generate(self, prompts, **kwargs):
        result = super().generate(prompts, **kwargs)
        self.calls.append((prompts.input_ids, prompts.attention_mask, result.response_ids, result.response_mask))
        return result


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tokenizer):
    return RecordingEngine(tiny_model_dir, "float32", tokenizer.eos_token_id, tokenizer.pad_token_id)


def _limits(**changes) -> EpisodeLimits:
    settings = dict(max_turns=4, max_turn_tokens=6, max_episode_tokens=60, step_timeout_seconds=30.0,
                    on_error="fail", max_concurrency=64, factory_name=FACTORY)
    return EpisodeLimits(**{**settings, **changes})


def _rows(n: int) -> list[EnvRow]:
    return [EnvRow(str(i % 10), None, {}, row_id=100 + i, source=f"rows.jsonl row {i}") for i in range(n)]


def _run(tokenizer, engine, make_env, n: int = 6, seed: int = 5, **limits):
    runner = EpisodeRunner(tokenizer, make_env, _limits(**limits))
    return runner.run(engine, _rows(n), list(range(n)), temperature=1.0, generation_seed=seed, greedy=False)


def _segments(flags: list[float]) -> list[tuple[float, int, int]]:
    """(flag, start, end) of each run of equal flags."""
    runs: list[tuple[float, int, int]] = []
    for position, flag in enumerate(flags):
        if runs and runs[-1][0] == flag:
            runs[-1] = (flag, runs[-1][1], position + 1)
        else:
            runs.append((flag, position, position + 1))
    return runs


@pytest.fixture(scope="module")
def three_turns(tokenizer, engine):
    """Episodes of up to three turns; the untrained model ends a turn (EOS) within 40
    tokens often enough that most reach a second one."""
    engine.calls.clear()
    batch = _run(tokenizer, engine, lambda: CountingEnv(turns=3, reward_turn=2), max_turn_tokens=40,
                 max_episode_tokens=200)
    return batch, list(engine.calls)


def test_every_turn_continues_from_the_sampled_ids_and_observations_are_context(tokenizer, three_turns):
    batch, calls = three_turns
    assert max(e.turns for e in batch.transcripts) >= 2
    for i, episode in enumerate(batch.transcripts):
        n = int(batch.response_mask[i].sum())
        response, actions = batch.response_ids[i, :n].tolist(), batch.action_mask[i, :n].tolist()
        opening = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
        sampled: list[int] = []
        for turn, (inputs, mask, ids, kept) in enumerate(calls[: episode.turns]):
            row = [e for e, other in enumerate(batch.transcripts) if other.turns > turn].index(i)
            context = inputs[row][mask[row].bool()].tolist()
            # Turn t starts from the opening and every token since, exactly as kept.
            assert context == opening + response[: len(context) - len(opening)]
            sampled += ids[row][kept[row].bool()].tolist()[:40]
        # The action tokens are what the engine sampled, never decoded and encoded again (S-ENV-2).
        assert [t for t, a in zip(response, actions) if a == 1.0] == sampled
        # Each observation is the template's rendering of the new message alone.
        observations = [(start, end) for flag, start, end in _segments(actions) if flag == 0.0]
        for number, (start, end) in enumerate(observations, start=1):
            assert tokenizer.decode(response[start:end]) == (
                f"\n<|im_start|>user\n{str(number) * 2}<|im_end|>\n<|im_start|>assistant\n"
            )
        assert batch.logprobs[i][batch.action_mask[i] == 0].abs().sum() == 0  # no log-prob off the actions


def test_the_turn_reward_sits_on_the_last_token_of_the_turn_that_earned_it(tokenizer, three_turns):
    batch, _ = three_turns
    rewarded = 0
    for i in range(len(batch.transcripts)):
        n = int(batch.response_mask[i].sum())
        turns = [(start, end) for flag, start, end in _segments(batch.action_mask[i, :n].tolist()) if flag == 1.0]
        stepped_second = len(turns) >= 2 and batch.response_ids[i, turns[1][1] - 1] == tokenizer.eos_token_id
        expected = torch.zeros(batch.turn_rewards.shape[1])
        if stepped_second:
            expected[turns[1][1] - 1] = 1.0
            rewarded += 1
        assert torch.equal(batch.turn_rewards[i], expected)
    assert rewarded >= 1, "no episode reached its rewarded second turn"


def test_the_same_seeds_give_the_same_episodes_byte_for_byte(tokenizer, engine):
    first = _run(tokenizer, engine, lambda: CountingEnv(turns=3), seed=11)
    second = _run(tokenizer, engine, lambda: CountingEnv(turns=3), seed=11)
    for name in ("prompt_ids", "response_ids", "response_mask", "action_mask", "logprobs", "turn_rewards"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    assert first.transcripts == second.transcripts


def test_a_raising_environment_fails_naming_itself_the_row_and_the_turn(tokenizer, engine):
    named = (r"CountingEnv \(rl.env.factory\) raised RuntimeError: the tool's database is down, at turn 1 of the "
             r"episode of row 100 \(rows.jsonl row 0\)")
    with pytest.raises(EnvironmentFailed, match=named):
        _run(tokenizer, engine, lambda: CountingEnv(raise_at=1), n=2, max_turn_tokens=60, max_episode_tokens=200)


def test_on_error_end_ends_the_episode_with_reward_zero_and_counts_it(tokenizer, engine):
    made = iter(range(1000))
    batch = _run(
        tokenizer, engine, lambda: CountingEnv(turns=2, reward_turn=1, raise_at=1 if next(made) == 0 else None),
        n=4, on_error="end", max_turn_tokens=60, max_episode_tokens=200,
    )
    assert batch.metrics["env/errors"] == 1.0
    assert batch.transcripts[0].failed and batch.turn_rewards[0].sum() == 0.0


def test_a_hung_step_is_named_after_the_timeout(tokenizer, engine):
    started = time.perf_counter()
    with pytest.raises(EnvironmentFailed, match=r"did not answer within rl.env.step_timeout_seconds=0.3, at turn 1"):
        _run(tokenizer, engine, lambda: CountingEnv(sleep=60.0), n=2, step_timeout_seconds=0.3, max_turn_tokens=60,
             max_episode_tokens=200)
    assert time.perf_counter() - started < 30.0  # the stage fails; it does not wait for the tool


def test_slow_steps_of_different_episodes_overlap(tokenizer):
    runner = EpisodeRunner(tokenizer, CountingEnv, _limits())
    episodes = [_Episode(row, 0) for row in _rows(16)]
    started = time.perf_counter()
    answers = runner._concurrently(episodes, 1, lambda episode: time.sleep(0.25) or episode.row.row_id)
    assert answers == [row.row_id for row in _rows(16)]  # gathered in batch order
    assert time.perf_counter() - started < 16 * 0.25 / 3  # one after the other would take 4 s


def test_a_tool_call_that_does_not_parse_is_answered_not_raised(tokenizer):
    runner = EpisodeRunner(tokenizer, CountingEnv, _limits())
    episode = _Episode(_rows(1)[0], 0, env=CountingEnv())
    episode.last_answer = episode.last_written = '<tool_call>\n{"name": "get", "arguments": \n</tool_call>'
    step = runner._step(episode)
    assert not step.done and step.reward == 0.0 and episode.parse_errors == 1
    assert step.messages[0]["role"] == "tool" and step.messages[0]["content"].startswith("error:")
    assert episode.env.turn == 0  # the environment never saw the unreadable turn


def test_the_engine_ends_a_response_at_a_stop_token_as_at_eos(tokenizer, engine):
    """An episode's other turn ends (Llama's <|eom_id|>) stop the real engine, kept in the
    response with mask 1.0 and nothing after it (S-ENV-2, S-BYO-5). The stop token is one
    the untrained model samples after its first token (same seed: the same draws), so it
    is met for sure."""
    from data.packing import PackedPrompts

    prompt = torch.tensor([tokenizer("7", add_special_tokens=False)["input_ids"]])
    packed = PackedPrompts(prompt, torch.ones_like(prompt))
    free = engine.generate(packed, max_new_tokens=12, temperature=1.0, seed=3)
    sampled = free.response_ids[0][free.response_mask[0].bool()].tolist()
    at = next(k for k in range(1, len(sampled) - 1) if sampled[k] not in sampled[:k])
    stopped = engine.generate(packed, max_new_tokens=12, temperature=1.0, seed=3, stop_token_ids=(sampled[at],))
    kept = stopped.response_ids[0][stopped.response_mask[0].bool()].tolist()
    assert kept == sampled[: at + 1] and len(kept) < len(sampled)
