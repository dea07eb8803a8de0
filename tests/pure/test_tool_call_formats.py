"""Tool-call formats as a registry (S-BYO-5): for each family, a chat template of its
documented format writes an assistant's call, the episode loop reads it back through the
format's parser, runs the tool and renders the answer in the format's role; malformed
calls are answered and counted; the template pre-flight names the role it could not
render and the fix; an unknown format is refused listing the known ones. And the
context checks of episodes: pre-flight refuses `rl.env.max_episode_tokens` at or beyond
the model's positions, the rollout refuses an opening that leaves too few, and the pre-flight
measures the openings of the project's own environments (never a user's).

The templates below are written for these tests to reproduce each family's documented
format (Qwen's Hermes-style tool use; Meta's Llama 3.1 JSON tool calling with the
`ipython` role; Mistral's v3 tokenizer with `[TOOL_CALLS]` and `[TOOL_RESULTS]`), cut to
the parts an episode uses; they are not copied from any model repository. The
tokenizers are character-level with each family's control tokens whole, built locally.
"""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from configs.loading import ConfigError, load_config
from contracts.faults import repeats_on_rerun
from environments.chat_tokens import TemplateError
from environments.episodes import EpisodeLimits, EpisodeRunner, OpeningTooLong
from environments.preflight import episode_context_problems, template_renders_tool_messages
from environments.protocol import EnvRow
from environments.tool_call_formats import FORMATS, format_named, formats_table
from environments.tool_calls import ToolCall, assistant_message
from environments.tools import ToolEnvironment, ToolRegistry
from roles.rollout.engine import GenerationResult
from tests.conftest import REPO_ROOT, TINY_PROFILE

# --- the families' templates (written for these tests from the documented formats) ---

# Qwen3 / Hermes: ChatML turns, tools listed in a system turn, each call a <tool_call>
# block of {"name", "arguments"}, a tool's answer inside <tool_response> in a user turn.
QWEN3_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nTools:\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Llama 3.1: header-delimited turns closed by <|eot_id|>; a call is the whole assistant
# turn as {"name", "parameters"}; a tool's answer is an `ipython` turn (roles `tool` and
# `ipython` both render so, as Meta's Hugging Face templates do). One call per turn.
_LLAMA_TURN = "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTo call a function, answer with only "
    "{\"name\": function name, \"parameters\": {argument name: value}}.\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role in ['tool', 'ipython'] %}{%- set role = 'ipython' %}{%- else %}"
    "{%- set role = message.role %}{%- endif %}"
    + _LLAMA_TURN +
    "{%- if message.tool_calls %}"
    "{%- if message.tool_calls | length != 1 %}{{- raise_exception('one tool call per turn') }}{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '{\"name\": \"' + call.name + '\", \"parameters\": ' }}{{- call.arguments | tojson }}{{- '}' }}"
    "{%- else %}{{- message.content }}{%- endif %}{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# A user's own Llama-3-style template, as the issue met it: it knows `ipython` and
# refuses any role it does not know, `tool` included.
LLAMA3_IPYTHON_ONLY = LLAMA3_TEMPLATE.replace("['tool', 'ipython']", "['ipython']").replace(
    "{%- set role = message.role %}",
    "{%- if message.role not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('Unknown role: ' + message.role) }}{%- endif %}{%- set role = message.role %}",
)

# Mistral (v3 tokenizer): [INST] ... [/INST] user turns with no EOS, the tools in
# [AVAILABLE_TOOLS] before the first one, an assistant turn closed by EOS; a call turn is
# [TOOL_CALLS] and a JSON list of {"name", "arguments", "id"}; a tool's answer is
# [TOOL_RESULTS] {"content", "call_id"} [/TOOL_RESULTS], and must name its call (nine
# letters or digits).
MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools and loop.first %}{{- '[AVAILABLE_TOOLS] ' }}{{- tools | tojson }}{{- '[/AVAILABLE_TOOLS]' }}"
    "{%- endif %}{{- '[INST] ' + message.content + '[/INST]' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}{{- '[TOOL_CALLS] [' }}"
    "{%- for entry in message.tool_calls %}"
    "{{- '{\"name\": \"' + entry.function.name + '\", \"arguments\": ' }}{{- entry.function.arguments | tojson }}"
    "{%- if entry.id %}{{- ', \"id\": \"' + entry.id + '\"' }}{%- endif %}{{- '}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}{{- ']' + eos_token }}"
    "{%- elif message.role == 'assistant' %}{{- message.content + eos_token }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if not message.tool_call_id or message.tool_call_id | length != 9 %}"
    "{{- raise_exception('a tool answer needs a tool_call_id of nine letters or digits') }}{%- endif %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' }}{{- message.content | tojson }}"
    "{{- ', \"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}"
    "{%- else %}{{- raise_exception('Unknown role: ' + message.role) }}{%- endif %}"
    "{%- endfor %}"
)

# Mistral's v11+ tokenizers (Mistral Small 3.1/3.2, Magistral, Devstral, Ministral 3): the
# tools in [AVAILABLE_TOOLS] before the user turns, [INST] ... [/INST] user turns, each call
# of an assistant turn written [TOOL_CALLS]name[ARGS]{arguments} one after another before
# its EOS, a tool's answer [TOOL_RESULTS]content[/TOOL_RESULTS] without a call id.
MISTRAL_V11_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}{{- '[AVAILABLE_TOOLS]' }}{{- tools | tojson }}{{- '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '[INST]' + message.content + '[/INST]' }}"
    "{%- elif message.role == 'assistant' %}{{- message.content or '' }}"
    "{%- for entry in message.tool_calls or [] %}"
    "{%- set arguments = entry.function.arguments %}"
    "{%- if arguments is not string %}{%- set arguments = arguments | tojson %}{%- endif %}"
    "{{- '[TOOL_CALLS]' + entry.function.name + '[ARGS]' + arguments }}"
    "{%- endfor %}{{- eos_token }}"
    "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS]' + message.content + '[/TOOL_RESULTS]' }}"
    "{%- else %}{{- raise_exception('Only user, assistant and tool roles are supported, got ' + message.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def char_tokenizer(template: str, specials: list[str], eos: str, bos: str) -> PreTrainedTokenizerFast:
    """One token per printable character, and each of `specials` whole (special tokens)."""
    pad, unk = "<pad>", "<unk>"
    controls = [pad, unk] + [token for token in specials if token not in (pad, unk)]
    characters = [chr(code) for code in range(32, 127)] + ["\n"]
    vocab = {token: index for index, token in enumerate(controls + characters)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(controls)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=pad, eos_token=eos, bos_token=bos, unk_token=unk, padding_side="left"
    )
    fast.chat_template = template
    return fast


FAMILIES = {
    "qwen3": lambda: char_tokenizer(QWEN3_TEMPLATE, ["<|im_start|>", "<|im_end|>"], "<|im_end|>", "<|im_start|>"),
    "llama3_json": lambda: char_tokenizer(
        LLAMA3_TEMPLATE,
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>",
         "<|eom_id|>"],
        "<|eot_id|>", "<|begin_of_text|>",
    ),
    "mistral": lambda: char_tokenizer(
        MISTRAL_TEMPLATE,
        ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
         "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        "</s>", "<s>",
    ),
    "mistral_v11": lambda: char_tokenizer(
        MISTRAL_V11_TEMPLATE,
        ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[ARGS]",
         "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        "</s>", "<s>",
    ),
}
FORMAT_OF = {"mistral_v11": "mistral"}  # a family whose format is registered under another name
# What each family's template writes where a tool's answer starts.
ANSWER_OPENS = {
    "qwen3": "<|im_start|>user\n<tool_response>\n",
    "llama3_json": "<|start_header_id|>ipython<|end_header_id|>\n\n",
    "mistral": "[TOOL_RESULTS] {\"content\": ",
    "mistral_v11": "[TOOL_RESULTS]",
}


def _format(family: str):
    return format_named(FORMAT_OF.get(family, family))


# --- the tool task ----------------------------------------------------------------------

TABLE = {"GN": "813", "QX": "402"}


def get(key: str) -> str:
    """The value stored under a key.

    Args:
        key: the key, two capital letters.
    """
    return TABLE[key]


class Lookup(ToolEnvironment):
    tools = ToolRegistry([get])

    def opening(self, row, seed):
        self.expected = TABLE[row.reference]
        return [{"role": "user", "content": row.prompt}]

    def answer(self, content):
        return 1.0 if content.strip() == self.expected else 0.0


def call_turn(tokenizer, calls: list[ToolCall], question: str = "value of GN?") -> str:
    """What the family's template writes for an assistant turn carrying `calls`, from the
    end of the generation prompt to the turn's EOS included: the tokens the model is
    trained to sample."""
    opening = [{"role": "user", "content": question}]
    tools = Lookup.tools.schemas()
    prompt = tokenizer.apply_chat_template(opening, tools=tools, add_generation_prompt=True, tokenize=False)
    message = assistant_message(_turn_of(calls))
    whole = tokenizer.apply_chat_template(opening + [message], tools=tools, tokenize=False)
    assert whole.startswith(prompt), (prompt, whole)
    turn = whole[len(prompt):]
    return turn[: turn.index(tokenizer.eos_token) + len(tokenizer.eos_token)]


def _turn_of(calls: list[ToolCall]):
    from environments.tool_calls import ParsedTurn

    return ParsedTurn("", calls, [])


class ScriptedEngine:
    """Samples the given text for every episode, turn after turn: scripts[episode][turn]."""

    def __init__(self, tokenizer, scripts: list[list[str]]):
        self.tokenizer, self.scripts, self.turn = tokenizer, scripts, 0
        self.stops: list[tuple[int, ...]] = []  # the stop_token_ids of each call

    def generate(self, prompts, *, max_new_tokens, temperature, seed, greedy=False, stop_token_ids=()):
        self.stops.append(tuple(stop_token_ids))
        going = [script for script in self.scripts if len(script) > self.turn]
        ids = [self.tokenizer(script[self.turn], add_special_tokens=False)["input_ids"] for script in going]
        self.turn += 1
        width = max(len(row) for row in ids)
        response = torch.full((len(ids), width), self.tokenizer.pad_token_id)
        mask = torch.zeros((len(ids), width))
        for i, row in enumerate(ids):
            response[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1.0
        return GenerationResult(response, mask, torch.zeros((len(ids), width)))


def _limits(**changes) -> EpisodeLimits:
    settings = dict(max_turns=3, max_turn_tokens=200, max_episode_tokens=600, step_timeout_seconds=30.0,
                    on_error="fail", max_concurrency=4, factory_name="tests.pure.test_tool_call_formats:Lookup")
    return EpisodeLimits(**{**settings, **changes})


def _rows(n: int) -> list[EnvRow]:
    return [EnvRow("value of GN?", "GN", {}, row_id=10 + i, source=f"rows.jsonl row {i}") for i in range(n)]


# --- the registry ---------------------------------------------------------------------


def test_the_registry_holds_the_three_families_and_refuses_an_unknown_name_listing_them():
    assert list(FORMATS)[:3] == ["qwen3", "llama3_json", "mistral"]
    assert {name: entry.tool_role for name, entry in FORMATS.items()} == {
        "qwen3": "tool", "llama3_json": "ipython", "mistral": "tool",
    }
    with pytest.raises(ValueError, match="unknown tool-call format 'llama'; the known formats are: qwen3, "
                                         "llama3_json, mistral"):
        format_named("llama")


def test_the_config_key_defaults_to_qwen3_and_refuses_an_unknown_format_by_key():
    env = "rl.env.factory=data.synthetic:addition_split"
    assert load_config(TINY_PROFILE, [env]).rl.env.tool_call_format == "qwen3"
    assert load_config(TINY_PROFILE, [env, "rl.env.tool_call_format=mistral"]).rl.env.tool_call_format == "mistral"
    with pytest.raises((ConfigError, ValidationError)) as caught:
        load_config(TINY_PROFILE, [env, "rl.env.tool_call_format=hermes"])
    assert "tool_call_format" in str(caught.value)
    assert "unknown tool-call format 'hermes'; the known formats are: qwen3, llama3_json, mistral" in str(caught.value)


def test_the_docs_list_every_format():
    assert formats_table() in (REPO_ROOT / "docs" / "howto" / "environments.md").read_text()


# --- each family's template, through the episode loop -----------------------------------


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_template_writes_a_call_the_format_reads_back(name):
    tokenizer, tool_format = FAMILIES[name](), _format(name)
    call_id = "a1b2c3d4e" if name == "mistral" else None
    calls = [ToolCall("get", {"key": "GN"}, call_id)]
    written = call_turn(tokenizer, calls)
    ids = tokenizer(written, add_special_tokens=False)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id
    # Decoded as the episode loop decodes a turn for this format.
    text = tokenizer.decode(ids[:-1], skip_special_tokens=not tool_format.reads_special_tokens)
    parsed = tool_format.parse(text)
    assert (parsed.tool_calls, parsed.errors, parsed.content) == (calls, [], "")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_an_episode_calls_the_tool_and_reads_its_answer_in_the_formats_role(name):
    tokenizer, tool_format = FAMILIES[name](), _format(name)
    call_id = "k3y5l00ku" if name == "mistral" else None
    good = call_turn(tokenizer, [ToolCall("get", {"key": "GN"}, call_id)])
    broken = {
        "qwen3": '<tool_call>\n{"name": "get", "arguments": {"key": \n</tool_call>',
        "llama3_json": '{"name": "get", "parameters": {"key": ',
        "mistral": '[TOOL_CALLS] [{"name": "get", "arguments": {"key": "GN"}',
        "mistral_v11": '[TOOL_CALLS]get[ARGS]{"key": ',
    }[name] + tokenizer.eos_token
    answer = "813" + tokenizer.eos_token
    engine = ScriptedEngine(tokenizer, [[good, answer], [broken, answer]])
    runner = EpisodeRunner(tokenizer, Lookup, _limits(), tool_format)
    batch = runner.run(engine, _rows(2), [0, 1], temperature=1.0, generation_seed=0, greedy=False)

    # The good call ran: the tool's answer is rendered as the family's template renders
    # a tool's answer, and the episode earned its reward.
    observed = []
    for i in range(2):
        n = int(batch.response_mask[i].sum())
        tokens, actions = batch.response_ids[i, :n].tolist(), batch.action_mask[i, :n].tolist()
        observed.append(tokenizer.decode([t for t, a in zip(tokens, actions) if a == 0.0]))
    # (ChatML writes the newline after the assistant's EOS as part of what follows it.)
    assert observed[0].lstrip("\n").startswith(ANSWER_OPENS[name]) and "813" in observed[0], observed[0]
    if name == "mistral":
        assert '"call_id": "k3y5l00ku"' in observed[0]  # the answer names the call it answers
    assert batch.turn_rewards[0].sum().item() == 1.0
    assert batch.transcripts[0].tool_calls == 1

    # The broken call never reached the environment: it was answered, in the same role,
    # and counted.
    assert observed[1].lstrip("\n").startswith(ANSWER_OPENS[name]) and "the tool call could not be read" in observed[1]
    assert batch.metrics["env/tool_call_parse_errors"] == 1.0
    assert batch.transcripts[1].tool_calls == 0
    # Transcripts keep the protocol's role; the assistant's turn as the format read it.
    assert [m["role"] for m in batch.transcripts[0].messages] == ["user", "assistant", "tool", "assistant"]
    if name.startswith("mistral"):
        assert batch.transcripts[0].messages[1]["content"].startswith("[TOOL_CALLS]")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_familys_template_passes_the_pre_flight_in_its_own_format(name):
    template_renders_tool_messages(FAMILIES[name](), _format(name))


def test_a_template_that_knows_only_ipython_is_refused_naming_the_role_and_the_fix():
    tokenizer = FAMILIES["llama3_json"]()
    tokenizer.chat_template = LLAMA3_IPYTHON_ONLY
    template_renders_tool_messages(tokenizer, format_named("llama3_json"))
    with pytest.raises(TemplateError) as caught:
        template_renders_tool_messages(tokenizer, format_named("qwen3"))
    message = str(caught.value)
    assert "cannot render a tool's answer in role 'tool' (rl.env.tool_call_format=qwen3)" in message
    assert "Unknown role: tool" in message
    assert "set rl.env.tool_call_format to your model family's format (qwen3 (role 'tool'), llama3_json (role " \
           "'ipython'), mistral (role 'tool')), or use a chat template that renders role 'tool'" in message


def test_a_template_that_drops_the_formats_role_is_refused_naming_it():
    tokenizer = FAMILIES["qwen3"]()
    with pytest.raises(TemplateError, match=r"does not render messages of role 'ipython' \(rl.env.tool_call_format="
                                            r"llama3_json answers tools in that role"):
        # ChatML renders any role by name, so an `ipython` turn keeps its text; this
        # template writes only the roles it knows.
        tokenizer.chat_template = QWEN3_TEMPLATE.replace(
            "{%- else %}{{- '<|im_start|>' + message.role",
            "{%- elif message.role in ['user', 'assistant', 'system'] %}{{- '<|im_start|>' + message.role",
        )
        template_renders_tool_messages(tokenizer, format_named("llama3_json"))


def test_pre_flight_names_rl_env_and_the_format_for_a_model_folder_with_an_ipython_only_template(tmp_path):
    from rundir.preflight import config_problems

    folder = tmp_path / "llama-like"
    tokenizer = FAMILIES["llama3_json"]()
    tokenizer.chat_template = LLAMA3_IPYTHON_ONLY
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    env = ["rl.env.factory=data.synthetic:addition_split", f"model.path={folder}"]
    problems = [str(p) for p in config_problems(load_config(TINY_PROFILE, env)) if p.key == "rl.env"]
    assert len(problems) == 1 and "role 'tool'" in problems[0] and "llama3_json (role 'ipython')" in problems[0]
    fixed = load_config(TINY_PROFILE, env + ["rl.env.tool_call_format=llama3_json"])
    assert [p for p in config_problems(fixed) if p.key == "rl.env"] == []


# --- the parsers' edges -----------------------------------------------------------------


@pytest.mark.parametrize("text, calls, content, errors", [
    ('<|python_tag|>{"name": "get", "parameters": {"key": "QX"}}', [ToolCall("get", {"key": "QX"})], "", []),
    ('{"name": "get", "arguments": "{\\"key\\": \\"QX\\"}"}', [ToolCall("get", {"key": "QX"})], "", []),
    ('{"name": "get", "parameters": {"key": "GN"}}; {"name": "get", "parameters": {"key": "QX"}}',
     [ToolCall("get", {"key": "GN"}), ToolCall("get", {"key": "QX"})], "", []),
    ("813", [], "813", []),
    ('{"name": "get", "parameters": ["GN"]}', [], "", ['"parameters" of \'get\' must be a JSON object']),
    ('{"key": "GN"}', [], "", ['"name" must be a non-empty string']),
    ('{"name": "get", "parameters": {"key": ', [], "", ["the JSON does not parse"]),
    ("<|python_tag|>get(key='GN')", [], "get(key='GN')", ["<|python_tag|> is not followed by a JSON object"]),
])
def test_llama3_json_reads_bare_objects_and_reports_what_is_not_a_call(text, calls, content, errors):
    parsed = format_named("llama3_json").parse(text)
    assert parsed.tool_calls == calls and parsed.content == content
    assert len(parsed.errors) == len(errors)
    for error, expected in zip(parsed.errors, errors):
        assert expected in error


@pytest.mark.parametrize("text, calls, content, errors", [
    ('Looking.[TOOL_CALLS] [{"name": "get", "arguments": {"key": "GN"}}, '
     '{"name": "get", "arguments": {"key": "QX"}, "id": "Zz9Zz9Zz9"}]',
     [ToolCall("get", {"key": "GN"}), ToolCall("get", {"key": "QX"}, "Zz9Zz9Zz9")], "Looking.", []),
    ("813", [], "813", []),
    ('[TOOL_CALLS] {"name": "get", "arguments": {"key": "GN"}}', [], "", ["expected a JSON list"]),
    ("[TOOL_CALLS] []", [], "", ["got an empty list"]),
    ('[TOOL_CALLS] [{"name": "get", "arguments": {"key": "GN"}, "id": "short"}]', [], "",
     ['"id" of \'get\' must be nine letters or digits, got "short"']),
    ('[TOOL_CALLS] [{"name": "get", "arguments": {"key": "GN"}}, {"arguments": {}}]',
     [ToolCall("get", {"key": "GN"})], "", ['tool call 2: "name" must be a non-empty string']),
    ('[TOOL_CALLS] [{"name": "get"', [], "", ["the JSON after [TOOL_CALLS] does not parse"]),
])
def test_mistral_reads_the_list_after_the_marker_and_reports_what_is_not_a_call(text, calls, content, errors):
    parsed = format_named("mistral").parse(text)
    assert parsed.tool_calls == calls and parsed.content == content
    assert len(parsed.errors) == len(errors), parsed.errors
    for error, expected in zip(parsed.errors, errors):
        assert expected in error


def test_qwen3_is_todays_parser_and_renders_answers_as_they_were():
    qwen3 = format_named("qwen3")
    text = '<tool_call>\n{"name": "get", "arguments": {"key": "GN"}}\n</tool_call>'
    from environments.tool_calls import parse_tool_calls

    assert qwen3.parse(text) == parse_tool_calls(text)
    answers = [{"role": "tool", "name": "get", "content": "813"}, {"role": "user", "content": "and QX?"}]
    assert qwen3.rendered_answers(answers, [ToolCall("get", {"key": "GN"})]) == answers
    assert not qwen3.reads_special_tokens


# --- context checks ---------------------------------------------------------------------


def test_an_opening_that_leaves_too_few_positions_fails_naming_the_row_the_numbers_and_the_keys():
    tokenizer = FAMILIES["llama3_json"]()
    opening = len(tokenizer(tokenizer.apply_chat_template(
        [{"role": "user", "content": "value of GN?"}], tools=Lookup.tools.schemas(), add_generation_prompt=True,
        tokenize=False,
    ), add_special_tokens=False)["input_ids"])
    limits = _limits(max_episode_tokens=100, max_turn_tokens=50)
    fits = EpisodeRunner(tokenizer, Lookup, limits, format_named("llama3_json"), positions=opening + 100)
    engine = ScriptedEngine(tokenizer, [["813<|eot_id|>"]])
    assert fits.run(engine, _rows(1), [0], temperature=1.0, generation_seed=0, greedy=False).metrics
    short = EpisodeRunner(tokenizer, Lookup, limits, format_named("llama3_json"), positions=opening + 99)
    with pytest.raises(OpeningTooLong) as caught:
        short.run(ScriptedEngine(tokenizer, [["813<|eot_id|>"]]), _rows(1), [0], temperature=1.0,
                  generation_seed=0, greedy=False)
    message = str(caught.value)
    assert "the opening of the episode of row 10 (rows.jsonl row 0)" in message
    assert f"is {opening} tokens" in message and f"beyond the model's context of {opening + 99}" in message
    assert "rl.env.max_episode_tokens=100" in message and "at most 99 (and" in message  # positions minus the opening
    assert "rl.env.max_turn_tokens=50" in message
    assert repeats_on_rerun(caught.value)  # a rerun would open the same way: no resume hint


def test_pre_flight_refuses_an_episode_budget_the_models_positions_cannot_hold():
    from configs.schema import EnvConfig

    env = EnvConfig(factory="data.synthetic:addition_split", max_episode_tokens=256, max_turn_tokens=64)
    [(key, message)] = episode_context_problems(env, 256)
    assert key == "rl.env.max_episode_tokens"
    assert message.startswith("is 256, not below the model's context of 256 positions (config.json)")
    assert "rl.env.max_turn_tokens (now 64)" in message
    assert episode_context_problems(env, 257) == []


def test_the_manifest_refuses_it_by_key_for_the_tiny_model_too():
    from rundir.preflight_checks import check_manifest

    env = ["rl.env.factory=data.synthetic:addition_split"]
    refused = check_manifest(load_config(TINY_PROFILE, env + ["rl.env.max_episode_tokens=256"]))
    assert [str(p) for p in refused.problems if p.key == "rl.env.max_episode_tokens"] == [
        "rl.env.max_episode_tokens: is 256, not below the model's context of 256 positions (config.json); the "
        "episode's opening (its messages and tools' schemas) plus its turns and observations must fit: set it below "
        "256 minus the opening's length, with rl.env.max_turn_tokens (now 64) at most as large"
    ]
    passed = check_manifest(load_config(TINY_PROFILE, env + ["rl.env.max_episode_tokens=200"]))
    assert "rl.env.max_episode_tokens" not in passed.keys()


def test_a_call_with_an_id_answers_naming_it():
    result = Lookup.tools.call(ToolCall("get", {"key": "GN"}, "a1b2c3d4e"))
    assert result.message == {"role": "tool", "name": "get", "content": "813", "tool_call_id": "a1b2c3d4e"}
    rendered = format_named("mistral").rendered_answers(
        [result.message, {"role": "tool", "content": "error: x"}], [ToolCall("get", {"key": "GN"}, "a1b2c3d4e")]
    )
    assert [m["tool_call_id"] for m in rendered] == ["a1b2c3d4e", "000000002"]
    assert json.dumps(rendered)  # plain data, as templates take it


def test_only_the_assistants_turn_must_end_with_eos():
    from environments.chat_tokens import ObservationEncoder

    mistral = FAMILIES["mistral"]()
    assert ObservationEncoder(mistral, mistral.eos_token).anchor_turns == 1  # no EOS after [INST] ... [/INST]
    mistral.chat_template = MISTRAL_TEMPLATE.replace("{{- message.content + eos_token }}", "{{- message.content }}")
    with pytest.raises(TemplateError, match="does not close the assistant's turn with its EOS token '</s>'"):
        ObservationEncoder(mistral, mistral.eos_token)


@pytest.fixture(scope="module")
def qwen3_family_model(tmp_path_factory):
    """A GPT-2 of 512 positions with the Qwen3-family template and tokenizer above."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("qwen3-family") / "model"
    tokenizer = FAMILIES["qwen3"]()
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_layer=1, n_embd=16, n_head=2, n_positions=512,
                               eos_token_id=tokenizer.eos_token_id)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _key_lookup_opening(folder) -> int:
    """The opening of the key-lookup environment's row 0, rendered here as the rollout does."""
    from data.synthetic import key_lookup_split
    from environments.key_lookup import GET_TOOL

    row = next(key_lookup_split(num_rows=20000, seed=0, split="train"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    text = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], tools=[GET_TOOL],
                                         add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _tools_manifest(tmp_path, folder, budget: int):
    from rundir.preflight_checks import check_manifest

    return check_manifest(load_config(REPO_ROOT / "configs" / "ppo_tiny_tools_cpu.py", [
        f"model.path={folder}", "model.tiny=null", "rl.validation=null", f"job.output_root={tmp_path}",
        f"rl.env.max_episode_tokens={budget}", f"rl.env.max_turn_tokens={min(budget, 64)}",
    ]))


def test_pre_flight_measures_the_projects_own_environments_opening_with_its_tools(tmp_path, qwen3_family_model):
    """S-BYO-5: the key-lookup environment (the project's own code) is opened on row 0 at
    pre-flight; its opening with the tool's schema plus the episode budget must fit."""
    opening = _key_lookup_opening(qwen3_family_model)
    assert 200 < opening < 400  # the schema is most of it
    refused = _tools_manifest(tmp_path, qwen3_family_model, 512 - opening + 1)
    [problem] = [p for p in refused.problems if p.key == "rl.env.max_episode_tokens"]
    assert problem.message.startswith(
        "the opening of the episode of row 0 (rl.data.factory data.synthetic:key_lookup_split row 0), from environment "
        f"environments.key_lookup:make_environment (rl.env.factory), is {opening} tokens")
    assert "that is 513 positions, beyond the model's context of 512" in problem.message
    assert f"lower rl.env.max_episode_tokens to at most {512 - opening}" in problem.message
    fits = _tools_manifest(tmp_path, qwen3_family_model, 512 - opening)
    assert "rl.env.max_episode_tokens" not in fits.keys(), fits.problems
    assert (f"episode openings: the longest of 1 measured is {opening} tokens (rl.data.factory "
            "data.synthetic:key_lookup_split row 0); with rl.env.max_episode_tokens="
            f"{512 - opening}, 512 of the model's 512 positions") in fits.summary


def test_pre_flight_never_opens_a_users_environment_and_says_who_measures_it(tmp_path, qwen3_family_model):
    """S-SEC-3: a user's environment is user code, which the pre-flight does not call; the
    manifest says the first episode measures its opening instead."""
    from rundir.preflight_checks import check_manifest

    marker = tmp_path / "opened"
    (tmp_path / "my_env.py").write_text(
        "from environments.key_lookup import KeyLookup\n\n"
        f"def make():\n    open({str(marker)!r}, 'w').close()\n    return KeyLookup()\n"
    )
    profile = tmp_path / "my_tools.py"
    profile.write_text(
        "from configs.ppo_tiny_tools_cpu import CONFIG as BASE\n\n"
        "CONFIG = BASE.model_copy(update={'rl': BASE.rl.model_copy(update={\n"
        "    'env': BASE.rl.env.model_copy(update={'factory': 'my_env:make'}), 'validation': None})})\n"
    )
    report = check_manifest(load_config(profile, [f"model.path={qwen3_family_model}", "model.tiny=null",
                                                  f"job.output_root={tmp_path / 'out'}"]))
    assert not marker.exists()
    assert any(note.startswith("rl.env.factory=my_env:make: user code, which this check does not call; the first "
                               "episode measures its opening") for note in report.notes), report.notes


@pytest.mark.parametrize("text, calls, content, errors", [
    ('Looking.[TOOL_CALLS]get[ARGS]{"key": "GN"}[TOOL_CALLS]get[ARGS]{"key": "QX"}',
     [ToolCall("get", {"key": "GN"}), ToolCall("get", {"key": "QX"})], "Looking.", []),
    ('[TOOL_CALLS]get[CALL_ID]Zz9Zz9Zz9[ARGS]{"key": "GN"}', [ToolCall("get", {"key": "GN"}, "Zz9Zz9Zz9")], "", []),
    ('[TOOL_CALLS]get{"key": "GN"}', [], "", ["expected the tool's name, [ARGS] and a JSON object"]),
    ('[TOOL_CALLS]get[ARGS]{"key": ', [], "", ["the JSON after [ARGS] of 'get' does not parse"]),
    ('[TOOL_CALLS]get[ARGS]["GN"]', [], "", ['"arguments" of \'get\' must be a JSON object']),
    ('[TOOL_CALLS]get me[ARGS]{}[TOOL_CALLS]get[ARGS]{"key": "GN"}', [ToolCall("get", {"key": "GN"})], "",
     ["the tool's name before [ARGS] must be letters, digits"]),
])
def test_mistral_reads_the_v11_form_call_by_call_and_reports_what_is_not_a_call(text, calls, content, errors):
    """Mistral's v11+ tokenizers write `[TOOL_CALLS]name[ARGS]{...}` per call (S-BYO-5)."""
    parsed = format_named("mistral").parse(text)
    assert parsed.tool_calls == calls and parsed.content == content
    assert len(parsed.errors) == len(errors), parsed.errors
    for error, expected in zip(parsed.errors, errors):
        assert expected in error


def test_a_llama_turn_ending_with_end_of_message_is_a_call_the_ipython_answer_follows():
    """Llama 3.1 ends a `<|python_tag|>` call with `<|eom_id|>` when it waits for the
    tool's output: the engine is told to stop there too, the call is read and answered."""
    tokenizer = FAMILIES["llama3_json"]()
    eom = tokenizer.convert_tokens_to_ids("<|eom_id|>")
    call = '<|python_tag|>{"name": "get", "parameters": {"key": "GN"}}<|eom_id|>'
    engine = ScriptedEngine(tokenizer, [[call, "813<|eot_id|>"]])
    runner = EpisodeRunner(tokenizer, Lookup, _limits(), format_named("llama3_json"))
    batch = runner.run(engine, _rows(1), [0], temperature=1.0, generation_seed=0, greedy=False)
    assert engine.stops == [(eom,), (eom,)]
    n = int(batch.response_mask[0].sum())
    tokens, actions = batch.response_ids[0, :n].tolist(), batch.action_mask[0, :n].tolist()
    assert actions[tokens.index(eom)] == 1.0  # sampled, kept in the episode, trained on
    after = tokenizer.decode(tokens[tokens.index(eom) + 1:])
    assert after.startswith(ANSWER_OPENS["llama3_json"] + "813")
    assert batch.transcripts[0].tool_calls == 1 and batch.turn_rewards[0].sum().item() == 1.0
    assert batch.metrics["env/tool_call_parse_errors"] == 0.0


def test_several_end_tokens_end_a_response_at_the_first():
    from roles.rollout.engine import response_mask_from_ids

    ids = torch.tensor([[5, 7, 9, 7, 3], [5, 8, 9, 9, 9]])
    assert response_mask_from_ids(ids, 7).tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert response_mask_from_ids(ids, [7, 8]).tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]]
