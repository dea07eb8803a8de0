"""Private internals of torch, transformers, vLLM, Ray, Prefect, PEFT and NIXL live only
in compat/ (S-DEP-2): there each is version-guarded, with a public fallback and a
contract test (tests/in_process/test_compat.py). This test parses every production
module (each top-level package but tests/ and bench/) and fails on one elsewhere:

- an import or attribute chain rooted at one of those packages with a `_`-prefixed part
  (`ray._private`, `torch.distributed._tensor`, `nixl_cu12._api`), or a documented-private
  path (`prefect.server`, `prefect._internal`, `vllm.model_executor`, ...);
- a `_`-prefixed attribute, keyword argument or `getattr` name that the project itself
  never defines, on any object (`module._buffers`, `model._no_split_modules`,
  `create(_sync=True)`): not defined here, it is a dependency's;
- a name reached through a public one but private by documentation (DOCUMENTED_PRIVATE);
- a string literal that names such an internal: a private dotted path, a private
  setting (`PREFECT__SERVER_EPHEMERAL`), a private name beside a dependency's module
  path (a pickle allowlist), a file of a dependency's private package (Ray's
  `default_worker.py`), or a settings file Prefect reads (`profiles.toml`).

Parsing only: no dependency is imported. EXCEPTIONS names each place allowed anyway,
with its reason.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

from tests.conftest import REPO_ROOT

DEPENDENCIES = ("torch", "transformers", "vllm", "ray", "prefect", "peft", "nixl", "nixl_cu12", "nixl_cu13")
COMPAT = "compat"
# Paths their projects document as internal: Prefect's server implementation (clients
# use prefect.client), vLLM's model executor (users go through vllm.LLM).
PRIVATE_PATHS = ("prefect.server", "prefect._internal", "vllm.model_executor", "ray._private", "ray._raylet")
# Names reached through a public name whose definition is private: the test cannot see
# through the class, so they are listed with where they really live.
DOCUMENTED_PRIVATE = {
    "drain_all": "QueueService.drain_all, defined in prefect._internal.concurrency.services",
    "__ray_call__": "Ray's undocumented actor method for running a function inside the actor",
    "llm_engine": "vLLM's LLM.llm_engine: the engine object behind the LLM class's public methods",
    "vllm_config": "vLLM's engine configuration object (vllm.config), read from the engine",
}
# Private environment settings: Prefect's double-underscore settings are set by Prefect
# for its own subprocesses and are not documented.
PRIVATE_SETTING = re.compile(r"^PREFECT__[A-Z_]+$")
# Files a dependency reads its own settings from: reading them around it (as text, before
# it is imported) depends on where and how it looks, which it may change.
SETTINGS_FILES = {"profiles.toml": "Prefect's profiles file", "prefect.toml": "Prefect's settings file"}
# `_`-prefixed names of the standard library that are public API.
STDLIB_PUBLIC = {"_exit", "_replace", "_asdict", "_fields", "_make", "_field_defaults", "_missing_", "_value_",
                 "_name_", "_generate_next_value_", "_ignore_", "_current_frames", "_getframe"}

# file:line -> why it stays. Aim: empty.
EXCEPTIONS: dict[str, str] = {}


def production_files() -> list[Path]:
    """Every .py under a top-level package but tests/ and bench/ (the Makefile's PRODUCTION_DIRS)."""
    packages = sorted(p.parent for p in REPO_ROOT.glob("*/__init__.py") if p.parent.name not in ("tests", "bench"))
    return [path for package in packages for path in sorted(package.rglob("*.py"))]


def is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def dependency_root(dotted: str) -> str | None:
    root = dotted.split(".", 1)[0]
    return root if root in DEPENDENCIES else None


def private_path(dotted: str) -> bool:
    """A dotted path into a dependency that is private: a `_` part, or a documented-private prefix."""
    if dependency_root(dotted) is None:
        return False
    parts = dotted.split(".")
    return any(is_private(part) for part in parts) or any(
        dotted == prefix or dotted.startswith(prefix + ".") for prefix in PRIVATE_PATHS
    )


@cache
def project_names() -> tuple[frozenset[str], frozenset[str]]:
    """The `_`-prefixed names production code outside compat/ defines: (functions,
    classes, variables, parameters, imported aliases; attributes it sets on `self`).
    Tests are left out: one that sets a dependency's private attribute would make it ours."""
    defined: set[str] = set()
    on_self: set[str] = set()
    for path in production_files():
        if path.relative_to(REPO_ROOT).parts[0] == COMPAT:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.alias):
                defined.add(node.asname or node.name.split(".")[0])
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                on_self.add(node.attr)
    return (frozenset(n for n in defined if n.startswith("_")), frozenset(n for n in on_self if n.startswith("_")))


def ours(name: str, on_self: bool = False) -> bool:
    """A private name the project defines (an attribute it sets on its own objects counts
    only when read from `self`: `module._buffers` is torch's even if a class here has one)."""
    defined, attributes = project_names()
    return name in defined or name in STDLIB_PUBLIC or (on_self and name in attributes)


@cache
def private_files_of_dependencies() -> dict[str, str]:
    """File name -> where it lives, for each file inside a `_`-prefixed package of an
    installed dependency (found, not imported)."""
    found: dict[str, str] = {}
    for name in DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            for path in Path(location).rglob("*.py"):
                inside = path.relative_to(location).parts[:-1]
                if any(is_private(part) for part in inside):
                    found.setdefault(path.name, f"{name}/{'/'.join(path.relative_to(location).parts)}")
    return found


COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
            ast.With, ast.AsyncWith, ast.Try, ast.Match)
ATTRIBUTE_BY_NAME = {"getattr", "hasattr", "setattr", "delattr"}


def names_a_dependency_module(text: str) -> bool:
    return "." in text and dependency_root(text) is not None and re.fullmatch(r"[\w.]+", text) is not None


class Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.bound: dict[str, str] = {}  # local name -> the dependency path an import bound it to
        self.found: list[tuple[int, str]] = []
        self.file_names: list[tuple[int, str]] = []  # `something.py` literals, checked against the dependencies
        self.docstrings: set[int] = set()
        self.beside_a_module_path = False  # in a statement that also names a dependency's module by string

    def note(self, node: ast.AST, what: str) -> None:
        self.found.append((node.lineno, what))

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt) and not isinstance(node, COMPOUND):
            outer = self.beside_a_module_path
            self.beside_a_module_path = any(
                isinstance(c, ast.Constant) and isinstance(c.value, str) and names_a_dependency_module(c.value)
                for c in ast.walk(node)
            )
            super().visit(node)
            self.beside_a_module_path = outer
        else:
            super().visit(node)

    def visit_Module(self, node: ast.Module) -> None:
        for scope in ast.walk(node):
            if isinstance(scope, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and scope.body:
                first = scope.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    self.docstrings.add(id(first.value))
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if dependency_root(alias.name):
                if private_path(alias.name):
                    self.note(node, f"import {alias.name}")
                if alias.asname:
                    self.bound[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    self.bound[root] = root

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or not dependency_root(node.module):
            return
        for alias in node.names:
            path = f"{node.module}.{alias.name}"
            if private_path(node.module) or private_path(path):
                self.note(node, f"from {node.module} import {alias.name}")
            self.bound[alias.asname or alias.name] = path

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, inner = [node.attr], node.value
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in self.bound:
            dotted = ".".join([self.bound[inner.id], *reversed(chain)])
            if private_path(dotted):
                self.note(node, dotted)
                return  # one finding per chain
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if is_private(node.attr) and not ours(node.attr, on_self):
            self.note(node, f".{node.attr} (a private attribute the project does not define)")
        elif node.attr in DOCUMENTED_PRIVATE:
            self.note(node, f".{node.attr} ({DOCUMENTED_PRIVATE[node.attr]})")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg and is_private(keyword.arg) and not ours(keyword.arg):
                self.note(keyword.value, f"{keyword.arg}= (a private keyword argument)")
        if isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_BY_NAME and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value) \
                    and not ours(name.value):
                self.note(name, f"{node.func.id}(..., {name.value!r}) (a private attribute the project does not "
                                "define)")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str) or id(node) in self.docstrings:
            return
        text = node.value
        if private_path(text) and re.fullmatch(r"[\w.]+", text):
            self.note(node, f"{text!r} (a private path)")
        elif PRIVATE_SETTING.match(text):
            self.note(node, f"{text!r} (a private setting)")
        elif text in SETTINGS_FILES:
            self.note(node, f"{text!r} ({SETTINGS_FILES[text]}, read around it)")
        elif self.beside_a_module_path and re.fullmatch(r"\w+", text) and is_private(text) and not ours(text):
            self.note(node, f"{text!r} (a private name beside a dependency's module path)")
        elif re.fullmatch(r"\w+\.py", text):
            self.file_names.append((node.lineno, text))


@cache
def findings() -> tuple[str, ...]:
    """`file:line: what` for each private internal outside compat/."""
    found = []
    for path in production_files():
        where = str(path.relative_to(REPO_ROOT))
        if where.startswith(COMPAT + "/"):
            continue
        finder = Finder()
        finder.visit(ast.parse(path.read_text(), where))
        private_files = private_files_of_dependencies() if finder.file_names else {}
        for line, name in finder.file_names:
            if name in private_files:
                finder.found.append((line, f"{name!r} (names {private_files[name]})"))
        found += [f"{where}:{line}: {what}" for line, what in sorted(set(finder.found))]
    return tuple(found)


def test_no_private_internal_of_a_dependency_outside_compat():
    left = [line for line in findings() if line.split(": ", 1)[0] not in EXCEPTIONS]
    assert left == [], "private internals outside compat/ (move each behind its compat module):\n" + "\n".join(left)


def test_every_exception_is_still_needed_and_says_why():
    places = {line.split(": ", 1)[0] for line in findings()}
    assert all(reason.strip() for reason in EXCEPTIONS.values())
    assert set(EXCEPTIONS) <= places, f"exceptions no longer found: {sorted(set(EXCEPTIONS) - places)}"


def check(source: str) -> list[str]:
    finder = Finder()
    finder.visit(ast.parse(source))
    private_files = private_files_of_dependencies()
    return [what for _, what in finder.found] + [name for _, name in finder.file_names if name in private_files]


def test_the_finder_finds_each_kind_of_internal():
    assert check("import ray._private.services") == ["import ray._private.services"]
    assert check("from torch.distributed._tensor import DTensor") == [
        "from torch.distributed._tensor import DTensor"]
    assert check("import nixl_cu12\nnixl_cu12._api.nixl_agent") == ["nixl_cu12._api.nixl_agent"]
    assert check("from prefect.server.api.server import create_app") != []
    assert check("import torch.distributed as dist\ndist._functional_collectives") == [
        "torch.distributed._functional_collectives"]
    assert check("model._no_split_modules_of_some_kind")[0].startswith("._no_split_modules_of_some_kind")
    assert check("getattr(model, '_not_defined_by_us', None)") != []
    assert check("artifact.create(_not_ours=True)") != []
    assert check("Worker.drain_all(timeout=1)") != []
    assert check("env = {'PREFECT__SERVER_EPHEMERAL': '1'}") != []
    assert check("path = 'ray._private.workers'") != []
    assert check("script = 'default_worker.py'") == ["default_worker.py"]
    assert check("home / 'profiles.toml'") != []
    # Public names, the project's own private names, and docstrings pass.
    assert check('"""Reads `ray._private`."""\nimport torch\ntorch.nn.functional.relu\nos._exit(0)') == []
    assert check("self._live_placements = None\nx._live_placements") == []
