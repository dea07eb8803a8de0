"""How a prompt becomes template text, for the policy's packer and a reward model, and
what a template's refusal of a conversation is reported as (S-BYO-4).

One rendering function per use, shared by the run and the pre-flight, so the pre-flight
renders exactly what the run will. No torch here: the pre-flight imports this module.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from contracts.faults import RepeatsOnRerun

Render = Callable[[list[dict]], str]  # a conversation -> template text; raises on what the template refuses


def as_conversation(prompt: Any) -> list[dict]:
    """A bare string prompt is one user turn (S-DATA-2)."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def render_prompt(tokenizer, prompt: Any) -> str:
    """The policy's prompt text: the chat template with the generation prompt."""
    return tokenizer.apply_chat_template(as_conversation(prompt), add_generation_prompt=True, tokenize=False)


def render_scored(tokenizer, prompt: Any, completion: str) -> str:
    """A reward model's text: the prompt and the completion as the assistant's turn."""
    conversation = [*as_conversation(prompt), {"role": "assistant", "content": completion}]
    return tokenizer.apply_chat_template(conversation, tokenize=False)


def role_sequence(prompt: Any) -> tuple[str, ...]:
    return tuple(str(message.get("role")) for message in as_conversation(prompt))


class TemplateRenderError(ValueError, RepeatsOnRerun):
    """A chat template refuses a row's conversation; a rerun would refuse it again."""


def rejected_message(render: Render, conversation: list[dict], message: str) -> int | None:
    """The index of the message whose role the template refused, where it can be told:
    the shortest prefix that fails, failing with the whole conversation's own message
    (a template that refuses a lone system turn for another reason names nothing)."""
    for end in range(1, len(conversation) + 1):
        try:
            render(conversation[:end])
        except Exception as error:  # jinja's errors share no base worth naming
            return end - 1 if end == len(conversation) or str(error) == message else None
    return None


def template_failure(
    render: Render, prompt: Any, error: BaseException, *, where: str, prompt_key: str, template: str
) -> TemplateRenderError:
    """The refusal naming the row (`where`), the key path of the role the template
    rejected (else the role sequence), the template's own message and the fix."""
    conversation = as_conversation(prompt)
    message = str(error)
    index = rejected_message(render, conversation, message) if isinstance(prompt, list) else None
    roles = ", ".join(role_sequence(prompt))
    if index is not None:
        role = conversation[index].get("role")
        what = f"`{prompt_key}[{index}].role` {role!r} (roles {roles})"
        fix = "edit the row, or use a model whose template accepts that role"
    else:
        what = f"the role sequence {roles} of `{prompt_key}`"
        fix = "edit the row, or use a model whose template accepts that sequence of roles"
    return TemplateRenderError(
        f"{where}: {template} cannot render {what}: {type(error).__name__}: {message}; {fix}"
    )


def first_rows_by_roles(prompts: Iterable[tuple[str, Any]]) -> dict[tuple[str, ...], tuple[str, Any]]:
    """The first (where, prompt) of each distinct role sequence among conversation
    prompts, in row order: what the pre-flight renders, so its cost does not grow
    with the rows."""
    first: dict[tuple[str, ...], tuple[str, Any]] = {}
    for where, prompt in prompts:
        if isinstance(prompt, list):
            first.setdefault(role_sequence(prompt), (where, prompt))
    return first


def render_each_sequence(
    render: Render, first: dict[tuple[str, ...], tuple[str, Any]], *, prompt_key: str, template: str
) -> list[TemplateRenderError]:
    """Render each distinct role sequence once (its first row); every refusal."""
    failures = []
    for where, prompt in first.values():
        conversation = as_conversation(prompt)
        try:
            render(conversation)
        except Exception as error:  # the template's own refusal, reported with the row
            failures.append(template_failure(
                render, prompt, error, where=where, prompt_key=prompt_key, template=template
            ))
    return failures


def render_all(render: Render, prompts: Sequence[Any], sources: Sequence[str] | None, *, template: str,
               prompt_key: str = "prompt") -> list[str]:
    """Each prompt's text, in order; the first the template refuses fails naming its
    row (`sources[i]`), as the pre-flight names it (S-BYO-3: never a resume hint)."""
    texts = []
    for index, prompt in enumerate(prompts):
        try:
            texts.append(render(as_conversation(prompt)))
        except Exception as error:
            where = sources[index] if sources else f"prompt {index} of the batch"
            raise template_failure(
                render, prompt, error, where=where, prompt_key=prompt_key, template=template
            ) from error
    return texts
