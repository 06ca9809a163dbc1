"""Imports point one way: no cycle between the project's modules, and no app importing an app
above it (the floors, ``MAY_IMPORT``).

The graph holds every import the code runs (module level and inside functions); imports under
``if TYPE_CHECKING:`` are for the type checker only and are left out. A package's ``__init__``
that re-exports its submodules is an edge like any other. A deferred import that must resolve
late (a registry) goes in ALLOWED_LATE with its reason; nothing needs one today.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("approvals", "boxsite", "schedules", "tasks")
# (importer, imported) edges allowed to close a cycle, each with why it must resolve late.
ALLOWED_LATE: dict[tuple[str, str], str] = {}

# The floors, bottom to top, and the floors each may import besides its own. ``core`` is boxsite's
# ground floor (errors, the principal, settings, the settings model); the ``roof`` is the rest of
# boxsite (URLs, pages, the scheduler, commands). An app reaches one above it only through what
# it declares and the upper one fills in at ``ready()`` (``tasks.pauses``, the task view's
# sections, ``tasks.tools.delegation.MAKERS``).
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "tasks": {"core"},
    "approvals": {"core", "tasks"},
    "schedules": {"core", "tasks", "approvals"},
    "roof": {"core", "tasks", "approvals", "schedules"},
}
BOXSITE_CORE = {"", "core", "models", "settings", "apps"}  # boxsite.<these> are the ground floor


def project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(child)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                found = known(target)
                if found and found != name and (name, found) not in ALLOWED_LATE:
                    graph[name].add(found)
    return graph


def floor(module: str) -> str:
    app, _, rest = module.partition(".")
    if app == "boxsite":
        return "core" if rest.partition(".")[0] in BOXSITE_CORE else "roof"
    return app


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module on a floor its importer may not import."""
    return sorted(f"{importer} -> {imported}" for importer, targets in graph.items() for imported in targets
                  if floor(imported) != floor(importer) and floor(imported) not in MAY_IMPORT[floor(importer)])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_projects_imports_have_no_cycle() -> None:
    assert cycles(import_graph(project_modules())) == []


def test_the_check_finds_a_cycle_when_there_is_one() -> None:
    graph = {"tasks.models": {"tasks.spec"}, "tasks.spec": {"tasks.models"}, "tasks.states": set()}
    assert cycles(graph) == [["tasks.models", "tasks.spec"]]


def test_each_app_imports_only_the_floors_below_it() -> None:
    assert arrows_up(import_graph(project_modules())) == []


def test_the_check_finds_an_import_up_the_floors() -> None:
    graph = {"tasks.services": {"approvals.blockers", "boxsite.core.errors"}, "approvals.blockers": {"tasks.models"},
             "boxsite.core.errors": {"boxsite.urls"}, "tasks.models": set(), "boxsite.urls": {"schedules.urls"}}
    assert arrows_up(graph) == ["boxsite.core.errors -> boxsite.urls", "tasks.services -> approvals.blockers"]


def test_the_lowest_modules_import_nothing_above_them() -> None:
    graph = import_graph(project_modules())
    assert not {m for m in graph["boxsite.core.errors"] if m.startswith("tasks")}
    assert "tasks.spec" not in graph["tasks.models"]
    assert not graph["tasks.run.leases"] & {"tasks.jobs", "tasks.services"}
    assert "tasks.services" not in graph["tasks.layers.review"]


def test_a_tasks_move_is_written_only_by_the_transition_functions() -> None:
    """``tasks.sql.moves.move_task`` writes a task's state with its events; only ``tasks.services``
    (its ``_try_write_task``, under the transition functions) may call it."""
    callers = {name for name, path in project_modules().items() if "move_task(" in path.read_text()}
    assert callers == {"tasks.services", "tasks.sql.moves"}
