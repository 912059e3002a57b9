"""The trainer package has no import cycle: its modules form layers, each importing only those below it.

The graph is read from the source with `ast` (nothing is imported). An edge is every import that can run:
at module level and inside functions, methods and classes alike, since a function-level import is the
usual way to hide a cycle (it postpones the circle to the first call instead of removing it). Imports
under `if TYPE_CHECKING:` are left out: they never run, and they are how a lower module names a higher
module's type in an annotation. Importing `trainer.dflash.loop` also runs the packages above it
(`trainer`, `trainer.dflash`), so those are edges too.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "trainer"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(path: Path, name: str) -> set[tuple[str, int]]:
    """(dotted name, line) of everything module `name` (at `path`) imports outside `if TYPE_CHECKING:`;
    for `from m import x` both `m` and `m.x` (x may be a submodule)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[tuple[str, int]] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:  # the else branch does run
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                out.update((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[:len(package) - (child.level - 1)]
                    mod = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    mod = child.module or ""
                out.add((mod, child.lineno))
                out.update((f"{mod}.{a.name}", child.lineno) for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: line of the first such import}."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        edges: dict[str, int] = {}
        for target, line in sorted(imported_names(path, name), key=lambda t: t[1]):
            while target and target not in files:  # `m.x` where x is a function, class or constant
                target = target.rpartition(".")[0]
            parts = target.split(".") if target else []
            for i in range(1, len(parts) + 1):  # the packages above it run first
                mod = ".".join(parts[:i])
                if mod in files and mod != name:
                    edges.setdefault(mod, line)
        graph[name] = edges
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def module_file(name: str) -> str:
    path = REPO / name.replace(".", "/")
    return str((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(REPO))


def test_the_trainer_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "trainer.config" in graph["trainer.cli"]  # the graph was read
    problems = []
    for comp in cycles(graph):
        members = set(comp)
        edges = [f"{module_file(a)}:{line} imports {b}" for a in comp
                 for b, line in graph[a].items() if b in members]
        problems.append(f"cycle {' <-> '.join(comp)}:\n    " + "\n    ".join(edges))
    assert not problems, "\n".join(problems)


DISPATCHER = "trainer.cli"
# The dispatcher's one importer: `python -m trainer`. The components take their argument helpers from
# trainer.cli_args.
DISPATCHER_IMPORTERS = {"trainer.__main__"}


def importers(graph: Mapping[str, Mapping[str, int]], module: str) -> dict[str, int]:
    """module -> line of its first import of `module`, for every module that imports it."""
    return {a: edges[module] for a, edges in graph.items() if module in edges}


def test_nothing_imports_back_into_the_cli_dispatcher() -> None:
    """The dispatcher imports the components (through `register`); an import the other way round makes
    every helper of the dispatcher a dependency of the component and every component a dependency of
    every other."""
    graph = import_graph()
    back = {a: line for a, line in importers(graph, DISPATCHER).items() if a not in DISPATCHER_IMPORTERS}
    assert "trainer.__main__" in importers(graph, DISPATCHER)  # the graph was read
    assert not back, "\n".join(f"{module_file(a)}:{line} imports {DISPATCHER}; take the argument helpers "
                               "from trainer.cli_args" for a, line in sorted(back.items()))


def test_an_import_back_into_the_dispatcher_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("import importlib\n")
    (pkg / "comp.py").write_text("def f():\n    from pkg.cli import g\n    return g\n")
    assert importers(import_graph(pkg), "pkg.cli") == {"pkg.comp": 2}


def test_a_cycle_is_found_even_through_a_function_level_import(tmp_path: Path) -> None:
    """The check can fail: a circle closed by an import inside a function is a cycle; one closed by an
    import under TYPE_CHECKING is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import B\n")
    (pkg / "b.py").write_text("B = 1\n\ndef f():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                              "    from pkg.a import X\n")
    (pkg / "d.py").write_text("from . import c\n")
    graph = import_graph(pkg)
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert graph["pkg.c"] == {} and graph["pkg.d"] == {"pkg": 1, "pkg.c": 1}
