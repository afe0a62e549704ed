"""No import cycles inside the package, between modules or between subpackages.

The check reads the source with `ast` and never imports it. Every ``.py`` file under
``src/torch_dataloader_utils`` is a module (``pkg/__init__.py`` is the module ``pkg``; a
directory without ``__init__.py`` still names its modules). An edge ``a -> b`` means that
executing ``a`` at import time imports ``b``, where ``b`` is in the package:

- Only module-level imports count: statements of the module body, including those nested in
  ``if``/``else``, ``try``/``except``/``finally``, ``with``, loops and class bodies. Imports
  inside functions and methods (lazy imports) run later, when called, and are not edges.
  Neither is the body of ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``), which never runs;
  its ``else:`` branch does run and counts.
- Relative imports are resolved against the importing module's package.
- ``import a.b.c`` and ``from a.b import c`` give one edge, to ``a.b.c`` when that is a module
  of the package, else to ``a.b``. The parent packages that Python initialises on the way
  (``a``, ``a.b``) are not edges, so a submodule does not depend on the root ``__init__``
  unless it imports a name from it.

The module graph must be acyclic. So must the subpackage graph, where each module is folded
into its first component below the root (``fs``, ``formats``, ``planning``, ...; a top-level
module such as ``dataset`` is a node of its own, and the root ``__init__`` is the node
``torch_dataloader_utils``): ``fs`` must not import ``formats`` if ``formats`` imports ``fs``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

PACKAGE = "torch_dataloader_utils"
ROOT = Path(__file__).resolve().parents[2] / "src" / PACKAGE

Graph = dict[str, set[str]]


# --- reading the source --------------------------------------------------------------------------


def module_name(path: Path, root: Path, package: str) -> str:
    """The dotted name of the module in ``path`` (``pkg/__init__.py`` is ``pkg``)."""
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}


# try/except* (Python 3.11+) has the same fields as try.
_TRY = (ast.Try, *([ast.TryStar] if hasattr(ast, "TryStar") else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported (see the module docstring)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue  # runs when called
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from module_level_imports(node.body)
            yield from module_level_imports(node.orelse)
        elif isinstance(node, _TRY):
            yield from module_level_imports(node.body)
            for handler in node.handlers:
                yield from module_level_imports(handler.body)
            yield from module_level_imports(node.orelse)
            yield from module_level_imports(node.finalbody)
        elif isinstance(node, ast.ClassDef | ast.With | ast.AsyncWith):
            yield from module_level_imports(node.body)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.While):
            yield from module_level_imports(node.body)
            yield from module_level_imports(node.orelse)
        elif isinstance(node, ast.Match):
            for case in node.cases:
                yield from module_level_imports(case.body)


def _resolve_relative(name: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module name of ``from <level dots><target> import ...`` in ``name``."""
    parts = name.split(".")
    if not is_package:
        parts.pop()  # a module's relative imports start from its package
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    if target:
        parts.append(target)
    return ".".join(parts)


def imports_of(name: str, path: Path, known: Mapping[str, Path], package: str) -> set[str]:
    """The package's modules that module ``name`` (source in ``path``) imports at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()

    def add(candidate: str) -> None:
        # The module itself if it is one, else the nearest enclosing module of the package.
        while candidate and candidate not in known:
            candidate = candidate.rpartition(".")[0]
        if candidate == package or candidate.startswith(package + "."):
            targets.add(candidate)

    for node in module_level_imports(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
            continue
        base = (
            _resolve_relative(name, is_package, node.level, node.module)
            if node.level
            else node.module or ""
        )
        for alias in node.names:
            child = f"{base}.{alias.name}"
            add(child if alias.name != "*" and child in known else base)
    targets.discard(name)
    return targets


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> Graph:
    """Module -> the package's modules it imports at module level."""
    known = modules(root, package)
    return {name: imports_of(name, path, known, package) for name, path in known.items()}


def subpackage_graph(graph: Mapping[str, set[str]], package: str = PACKAGE) -> Graph:
    """``graph`` with each module folded into its first component below ``package``."""

    def top(name: str) -> str:
        parts = name.split(".")
        return parts[1] if len(parts) > 1 else package

    folded: Graph = {top(name): set() for name in graph}
    for name, targets in graph.items():
        folded[top(name)] |= {top(t) for t in targets} - {top(name)}
    return folded


# --- finding cycles ------------------------------------------------------------------------------


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle in them (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def shortest_cycle(graph: Mapping[str, set[str]], start: str, within: set[str]) -> list[str]:
    """A shortest cycle through ``start`` using only the nodes ``within``: [start, ..., start]."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph.get(node, set()) & within):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if succ not in parents:
                    parents[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{start} is on no cycle within {sorted(within)}")


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each module that lies on a cycle, duplicates removed."""
    found: dict[tuple[str, ...], list[str]] = {}
    for component in strongly_connected(graph):
        members = set(component)
        for node in component:
            cycle = shortest_cycle(graph, node, members)
            ring = cycle[:-1]
            first = ring.index(min(ring))
            key = tuple(ring[first:] + ring[:first])  # the same cycle from any start
            found.setdefault(key, [*key, key[0]])
    return sorted(found.values())


def describe(found: Iterable[list[str]], package: str = PACKAGE) -> str:
    def short(name: str) -> str:
        return name.removeprefix(package + ".")

    return "\n".join(" -> ".join(short(n) for n in cycle) for cycle in found)


# --- the checks ----------------------------------------------------------------------------------


def test_no_import_cycles_between_modules() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, f"import cycles between modules:\n{describe(found)}"


def test_no_import_cycles_between_subpackages() -> None:
    graph = subpackage_graph(import_graph())
    found = cycles(graph)
    edges = "\n".join(f"{a} -> {', '.join(sorted(b))}" for a, b in sorted(graph.items()) if b)
    assert not found, f"import cycles between subpackages:\n{describe(found)}\ngraph:\n{edges}"


def test_the_graph_covers_the_package() -> None:
    # Guards the checks above from passing on an empty or misread graph.
    graph = import_graph()
    assert len(graph) == len(list(ROOT.rglob("*.py")))
    assert f"{PACKAGE}.errors" in graph[PACKAGE]


# --- the reader on small made-up packages --------------------------------------------------------


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_only_module_level_imports_are_edges(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "__init__.py": "from .a import x\n",
            "a.py": (
                "from typing import TYPE_CHECKING\n"
                "from . import b\n"
                "if TYPE_CHECKING:\n    from .c import C\nelse:\n    import pkg.sub.d\n"
                "try:\n    from .sub import e as _\nexcept ImportError:\n    pass\n"
                "class K:\n    from .c import C\n"
                "def f():\n    from . import z\n"
            ),
            "b.py": "",
            "c.py": "",
            "z.py": "",
            "sub/__init__.py": "from .. import b\nfrom ..c import C\n",
            "sub/d.py": "from .. import c, x\n",
            "sub/e.py": "from . import *\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub.d", "pkg.sub.e", "pkg.c"},
        "pkg.b": set(),
        "pkg.c": set(),
        "pkg.z": set(),
        "pkg.sub": {"pkg.b", "pkg.c"},
        "pkg.sub.d": {"pkg", "pkg.c"},
        "pkg.sub.e": {"pkg.sub"},
    }


def test_cycles_are_found_and_named(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": "from .sub import c\n",
            "sub/__init__.py": "",
            "sub/c.py": "from .. import a\n",
            "d.py": "from . import d\n",
            "e.py": "from .sub import c\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert describe(cycles(graph), "pkg") == "a -> b -> sub.c -> a"
    assert cycles(subpackage_graph(graph, "pkg")) == [["a", "b", "sub", "a"]]
