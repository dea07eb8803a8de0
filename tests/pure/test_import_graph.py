"""No module of the project imports one that imports it back (issue 15): the command
line, the manifest and the flow were a cycle (so `python -m flows.ppo` loaded the flow
twice and its StageFailed was not the class the CLI caught), and so were the text and
vision packers. Checked on the source, lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

# Every top-level package of the project (each a folder with an __init__.py), tests aside.
PACKAGES = tuple(sorted(
    path.parent.name for path in REPO_ROOT.glob("*/__init__.py") if path.parent.name not in ("tests", "bench")
))


def _import_graph() -> dict[str, set[str]]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                graph[name] |= {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                graph[name] |= {node.module} & modules.keys()
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names} & modules.keys()
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    path, seen = [start], set()

    def walk(node: str) -> list[str] | None:
        for target in sorted(graph[node]):
            if target == start:
                return path + [start]
            if target not in seen:
                seen.add(target)
                path.append(target)
                found = walk(target)
                if found:
                    return found
                path.pop()
        return None

    return walk(start)


def test_no_module_imports_itself_back():
    graph = _import_graph()
    assert "cli.command" in graph and graph["flows.ppo.__main__"] == {"cli.environment", "cli.command"}
    cycles = [cycle for name in sorted(graph) if (cycle := _cycle_through(graph, name))]
    assert cycles == [], " -> ".join(cycles[0])


# The rooms' floors, bottom to top (docs/architecture.md, "Import direction"): a module
# imports only modules of its own room or of a room below. The command line sits above
# the flow: `python -m flows.ppo` is only its entry point, the one module allowed to name
# a room above its own (flows/ppo/__init__.py says so). Role bodies are driven from
# above (the flow's runners, the actor launcher): the rooms below them share
# contracts/, never a role module.
FLOORS = (
    "compat", "files", "contracts", "configs", "algorithm", "data", "environments", "models", "placement",
    "checkpoint", "weights", "trainer", "rundir", "views", "tasks", "deployments", "roles", "processes", "flows",
    "cli",
)
ENTRY_POINT = "flows.ppo.__main__"


def _folder_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str, str, str]]:
    return {
        (module.split(".")[0], target.split(".")[0], module, target)
        for module, targets in graph.items() for target in targets
        if module.split(".")[0] != target.split(".")[0]
    }


def _up_the_floors(arrows: set[tuple[str, str, str, str]]) -> list[str]:
    floor = {room: number for number, room in enumerate(FLOORS)}
    return sorted(
        f"{module} -> {target} ({source}/ is below {folder}/)" for source, folder, module, target in arrows
        if floor[source] < floor[folder] and module != ENTRY_POINT
    )


def test_every_room_has_a_floor():
    """A new top-level package is given its place in FLOORS (and in the docs) first."""
    assert sorted(FLOORS) == sorted(PACKAGES)


def test_no_module_imports_a_module_of_a_higher_room():
    assert _up_the_floors(_folder_arrows(_import_graph())) == []


def test_the_floor_check_names_an_import_up_and_lets_the_entry_point_through():
    arrows = _folder_arrows({
        "contracts.experience": {"checkpoint.boundary"},
        ENTRY_POINT: {"cli.command"},
        "checkpoint.boundary": {"contracts.experience"},
    })
    assert _up_the_floors(arrows) == [
        "contracts.experience -> checkpoint.boundary (contracts/ is below checkpoint/)"
    ]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle_through({"a": {"b"}, "b": {"a"}}, "a") == ["a", "b", "a"]
    assert _cycle_through({"a": {"b"}, "b": set()}, "a") is None


def test_no_top_level_folder_holds_more_than_a_fifth_of_the_production_code():
    """A folder that needs "and" to describe it is split (STYLE.md): none grows past 20%."""
    lines = {package: sum(len(path.read_text().splitlines()) for path in (REPO_ROOT / package).rglob("*.py"))
             for package in PACKAGES}
    total = sum(lines.values())
    assert {"flows", "cli", "rundir", "views", "processes", "contracts", "compat"} <= set(PACKAGES)
    over = {package: f"{count / total:.0%}" for package, count in lines.items() if count > 0.2 * total}
    assert over == {}, over


def test_the_in_process_runner_imports_neither_prefect_nor_ray():
    """In-process runs (the learning curves, the overhead baseline) use neither service,
    so importing them must not pay for either (issue 32)."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, flows.in_process; print(sorted({'prefect', 'ray'} & set(sys.modules)))"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert loaded == "[]"
