"""Messages a user sees speak the user's language: no spec ids (`S-RUN-2`) in any string
production code holds (error and log lines, CLI help, config and metric descriptions
that the reference docs are generated from), nor in the flow's docstring, which the
Prefect UI shows as the parameters' help. Spec ids stay in comments, docstrings, tests,
docs and commit messages."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO_ROOT

SPEC_ID = re.compile(r"\bS-[A-Z]+-[0-9]+")
PACKAGES = sorted(
    path.parent.name for path in REPO_ROOT.glob("*/__init__.py") if path.parent.name not in ("tests", "bench")
)
SHOWN_DOCSTRINGS = {("flows/training.py", "ppo")}  # the Prefect UI's parameter help


def _documentation(tree: ast.AST) -> set[int]:
    """Docstrings and bare string statements (attribute docs): read in the source only."""
    quiet: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                quiet.add(id(statement.value))
    return quiet


def _spec_ids_users_see() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT).as_posix()
            tree = ast.parse(path.read_text())
            quiet = _documentation(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in quiet:
                    if SPEC_ID.search(node.value):
                        found.append(f"{relative}:{node.lineno}: {SPEC_ID.search(node.value).group()}")
                elif isinstance(node, ast.FunctionDef) and (relative, node.name) in SHOWN_DOCSTRINGS:
                    if SPEC_ID.search(ast.get_docstring(node) or ""):
                        found.append(f"{relative}:{node.lineno}: the docstring of {node.name}")
    return found


def test_no_message_a_user_sees_cites_a_spec_id():
    assert _spec_ids_users_see() == []


def test_the_check_finds_a_spec_id_in_a_message(tmp_path):
    tree = ast.parse('"""S-RUN-1 in a docstring is fine."""\nraise ValueError("bad value (S-RUN-2)")\n')
    quiet = _documentation(tree)
    shown = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in quiet]
    assert shown == ["bad value (S-RUN-2)"]
