"""Where the critic starts (S-RM-2): the policy's own model (the default) or another
folder, usually the reward model (`model.critic_path`), as InstructGPT, TRL and
OpenRLHF do: its backbone and its one-label score head become the critic's backbone
and value head, so the first value estimates already track the reward.

The critic reads the policy's token ids, so the folder must share the policy's
vocabulary token for token; read from the tokenizer files alone (no transformers),
so the pre-flight and the critic role refuse the same folders with the same words.
"""

from __future__ import annotations

import json
from pathlib import Path

from contracts.faults import RepeatsOnRerun

KEY = "model.critic_path"


class CriticSourceError(ValueError, RepeatsOnRerun):
    pass


def _vocabulary(folder: Path) -> dict[str, int] | None:
    from tokenizers import Tokenizer

    if not (folder / "tokenizer.json").is_file():
        return None
    return Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)


def critic_source_problems(policy_folder: str, critic_folder: str) -> list[str]:
    """Why `critic_folder` cannot start the critic of the policy at `policy_folder`
    (messages without the key), or none."""
    critic, policy = Path(critic_folder), Path(policy_folder)
    if not (critic / "config.json").is_file():
        return [f"{critic_folder!r} has no config.json (expected a Hugging Face model folder, e.g. the reward model)"]
    config = json.loads((critic / "config.json").read_text(encoding="utf-8"))
    problems = []
    if config.get("vision_config") is not None:
        problems.append(f"{critic_folder} is a vision-language model; a critic can start only from a text model")
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    classifier = any(a.endswith(("ForSequenceClassification", "ForTokenClassification")) for a in architectures)
    labels = len(config.get("id2label") or {}) or config.get("num_labels") or 2
    if classifier and labels != 1:
        problems.append(f"{critic_folder} is a classifier with {labels} labels; a value head has one")
    critic_vocab, policy_vocab = _vocabulary(critic), _vocabulary(policy)
    if critic_vocab is None or policy_vocab is None:
        missing = critic_folder if critic_vocab is None else policy_folder
        problems.append(
            f"{missing} has no tokenizer.json, so its vocabulary cannot be compared with the other's; the critic "
            "reads the policy's token ids and must share its vocabulary exactly"
        )
    elif critic_vocab != policy_vocab:
        differing = sorted(set(critic_vocab.items()) ^ set(policy_vocab.items()), key=lambda item: item[1])
        token, index = differing[0]
        problems.append(
            f"{critic_folder}'s vocabulary differs from the policy's ({len(critic_vocab)} vs {len(policy_vocab)} "
            f"tokens; first difference: {token!r} at id {index}); the critic reads the policy's token ids, so it can "
            "start only from a model with the policy's tokenizer (a reward model trained on the policy's base)"
        )
    rows = config.get("vocab_size")
    if isinstance(rows, int) and policy_vocab is not None and rows < len(policy_vocab):
        problems.append(
            f"{critic_folder}'s embedding has {rows} rows, fewer than the policy's {len(policy_vocab)} tokens"
        )
    return problems


def require_critic_source(policy_folder: str, critic_folder: str) -> None:
    problems = critic_source_problems(policy_folder, critic_folder)
    if problems:
        raise CriticSourceError(f"{KEY}: " + "; ".join(problems))
