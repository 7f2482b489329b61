"""The package's layout: no import circle among corral's modules, no module name used twice,
no private name imported from another module.

The imports are read from the source with :mod:`ast`, not run. Every import of a corral
module counts, at module level or inside a function (not those under ``if
TYPE_CHECKING:``, which never run): a function-level import still makes one module
depend on another, and it is how the circles this test was written against were closed
(``corral.checker`` imported ``corral.batched_checker`` inside ``check_env``). The one
kind of function-level import that may close a circle is a lazy import of an optional
extra (``corral.train`` takes the training stack, and torch with it, only when called);
each such edge is listed in :data:`LAZY` with its reason. An edge goes to the module
named, or, for ``from package import name`` where ``name`` is no module, to the package.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "corral"

LAZY = {
    ("corral", "corral.training"): "corral.train imports torch (the train extra) when called",
    ("corral.training.runner", "corral.workers.worker_set"): "a run starts rollout workers "
    "(the ray extra) only when runners > 0",
}
"""Function-level imports allowed to close a circle -> why they are lazy."""


def module_name(path: Path, src: Path) -> str:
    """``corral.checks.engine`` for ``src/corral/checks/engine.py``; a package's
    ``__init__.py`` is the package."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that may run: all but those under ``if TYPE_CHECKING:``."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def imported_modules(
    node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: set[str]
) -> Iterator[str]:
    """The corral modules that ``node``, in the module ``importer``, makes Python run."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == PACKAGE:
                yield alias.name
        return
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    if base.split(".")[0] != PACKAGE:
        return
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in known else base


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the corral modules it imports (:data:`LAZY` edges left out)."""
    files = {module_name(p, src): p for p in sorted((src / PACKAGE).rglob("*.py"))}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {
            target
            for node in imports(tree)
            for target in imported_modules(node, name, is_package, known)
            if target in known and target != name and (name, target) not in LAZY
        }
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or ``None`` if the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles, found one at a time and each broken at its last edge before the next
    search: empty if and only if the graph has no circle."""
    cycles = []
    remaining = {node: set(targets) for node, targets in graph.items()}
    while (cycle := find_cycle(remaining)) is not None:
        cycles.append(cycle)
        remaining[cycle[-2]].discard(cycle[-1])  # break it, to look for the next one
    return cycles


def test_no_import_circle() -> None:
    cycles = all_cycles(import_graph(SRC))
    listed = "\n".join("  " + " -> ".join(cycle) for cycle in cycles)
    assert not cycles, f"modules of corral that import one another:\n{listed}"


def test_no_module_name_is_used_twice() -> None:
    names = Counter(p.name for p in (SRC / PACKAGE).rglob("*.py") if p.name != "__init__.py")
    twice = {
        name: sorted(str(p.relative_to(SRC)) for p in (SRC / PACKAGE).rglob(name))
        for name, count in names.items()
        if count > 1
    }
    assert not twice, f"module names used more than once under src/corral: {twice}"


def test_no_module_imports_a_private_name_of_another() -> None:
    """What modules share has a public name (and a docstring); ``_name`` stays in its module."""
    files = {module_name(p, SRC): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}
    found = []
    for name, path in files.items():
        for node in imports(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            private = [a.name for a in node.names if a.name[:1] == "_" and a.name[:2] != "__"]
            if private and (node.level or (node.module or "").split(".")[0] == PACKAGE):
                found.append(f"{name} imports {private} from {'.' * node.level}{node.module}")
    assert found == [], "private names imported from another module"


def test_the_graph_finds_a_circle(tmp_path: Path) -> None:
    """The reader follows relative imports, ``from package import module`` and
    function-level imports, and leaves out ``TYPE_CHECKING`` imports and :data:`LAZY` edges."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("def train():\n    from corral.training import x\n")
    (pkg / "training.py").write_text("import corral\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("from corral.top import thing\n")
    (pkg / "top.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from corral.lazy import x\n"
        "def f():\n    from .sub import a\n"
    )
    (pkg / "lazy.py").write_text("import corral.top\n")
    graph = import_graph(tmp_path)
    assert graph["corral"] == set()
    assert graph["corral.training"] == {"corral"}
    assert graph["corral.sub.a"] == {"corral.sub.b"}
    assert graph["corral.top"] == {"corral.sub.a"}
    assert graph["corral.lazy"] == {"corral.top"}
    assert all_cycles(graph) == [["corral.top", "corral.sub.a", "corral.sub.b", "corral.top"]]
    assert module_name(pkg / "sub" / "__init__.py", tmp_path) == "corral.sub"
