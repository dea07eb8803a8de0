"""A user's own project folder, outside the repository (issue 46): a profile deriving
from a bundled one, a reward module beside it, a JSONL file with the user's own
column names. Written by tests; nothing here is on PYTHONPATH."""

from __future__ import annotations

import json
from pathlib import Path

# A reward a user might write: it looks at the completion's first character, and so
# raises IndexError on an empty completion.
REWARD_MODULE = '''
def score(ctx):
    return ctx.completion.strip()[0] == ctx.reference[0]
'''

PROFILE = '''"""My own run: the tiny CPU profile with my model, data and reward."""

from configs.ppo_tiny_cpu import CONFIG as BASE
from configs.schema import DataConfig, RewardConfig

CONFIG = BASE.model_copy(update={{
    "job": BASE.job.model_copy(update={{"name": "my-run", "output_root": {output_root!r}}}),
    "model": BASE.model.model_copy(update={{"path": {model!r}, "tiny": None}}),
    "rl": BASE.rl.model_copy(update={{
        "data": DataConfig(path={data!r}, prompt_key="question", reference_key="answer"),
        "reward": RewardConfig(terminal_callable="{module}:score"{on_error}),
        "validation": None,
    }}),
}})
'''


def question_rows(count: int) -> list[dict]:
    return [{"question": f"{i} plus 1?", "answer": str(i + 1)} for i in range(count)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_user_project(
    root: Path, model: Path, *, module: str = "myrewards", rows: list[dict] | None = None,
    reward_source: str = REWARD_MODULE, on_error: str | None = None,
) -> Path:
    """root/my_profile.py, root/<module>.py, root/questions.jsonl; returns the profile.
    Named like no module (issue 59 item 8: a profile.py hides Python's `profile`)."""
    root.mkdir(parents=True, exist_ok=True)
    data = write_rows(root / "questions.jsonl", question_rows(64) if rows is None else rows)
    (root / f"{module}.py").write_text(reward_source)
    profile = root / "my_profile.py"
    profile.write_text(PROFILE.format(
        output_root=str(root / "outputs"), model=str(model), data=str(data), module=module,
        on_error=f", on_error={on_error!r}" if on_error else "",
    ))
    return profile
