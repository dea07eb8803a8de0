"""Token ids of an episode's text, added turn by turn (S-ENV-2).

The history is never rendered and tokenised again: the sampled assistant tokens are
kept as the engine returned them, and only the environment's new messages are turned
into tokens. Those are what the chat template writes after an assistant turn's end
token, up to and including the next generation prompt; found by rendering one fixed
conversation with and without the new messages, so any template (Qwen3's, ChatML, a
user's) gives its own separators without a rule per model.
"""

from __future__ import annotations

from typing import Any

_ANCHOR = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class TemplateError(ValueError):
    """The model's chat template cannot render what the environment said."""


def render(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation, tokenize=False
        )
    except Exception as error:  # jinja's errors carry no common base worth naming
        roles = ", ".join(sorted({str(m.get("role")) for m in messages}))
        raise TemplateError(
            f"the model's chat template cannot render messages with roles {roles}"
            f"{' and tools' if tools else ''}: {type(error).__name__}: {error}"
        ) from error


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def opening_ids(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The episode's prompt: its opening messages with the generation prompt."""
    return encode(tokenizer, render(tokenizer, messages, tools, generation=True))


class ObservationEncoder:
    """The tokens an observation appends after an assistant turn that ended with the
    end-of-turn token `eos_token`: what the template writes after the fixed anchor
    conversation's closing `eos_token` (the assistant's) once the messages follow it.
    Counted by EOS rather than compared as text, since a template may render a past
    assistant turn unlike a last one (Qwen3 drops the empty think block)."""

    def __init__(self, tokenizer, eos_token: str):
        self.tokenizer = tokenizer
        self.eos_token = eos_token
        anchor = render(tokenizer, _ANCHOR, None, generation=False)
        self.anchor_turns = anchor.count(eos_token)
        # Only the assistant's turn must end with EOS: Mistral's templates close no user turn with it.
        if self.anchor_turns < 1 or not anchor.rstrip().endswith(eos_token):
            raise TemplateError(
                f"the model's chat template does not close the assistant's turn with its EOS token {eos_token!r}; "
                "episodes continue from the sampled tokens, so an assistant turn must end with it"
            )

    def ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return encode(self.tokenizer, self.text(messages))

    def text(self, messages: list[dict[str, Any]]) -> str:
        rendered = render(self.tokenizer, _ANCHOR + messages, None, generation=True)
        cut = -1
        for _ in range(self.anchor_turns):
            cut = rendered.find(self.eos_token, cut + 1)
            if cut < 0:
                raise TemplateError("the model's chat template drops turns once an observation follows them")
        return rendered[cut + len(self.eos_token):]
