"""No import cycles inside the package, between modules or between subpackages.

The check reads the source with `ast` and never imports it. Every ``.py`` file under
``src/torch_dataloader_utils`` is a module (``pkg/__init__.py`` is the module ``pkg``; a
directory without ``__init__.py`` still names its modules). An edge ``a -> b`` means that ``a``
imports ``b`` anywhere, where ``b`` is in the package:

- Every import counts: at module level, inside functions and methods (a lazy import is a
  dependency all the same, run later), and under ``if TYPE_CHECKING:`` (the types name it). A
  cycle hidden in a function is still a cycle of meaning: two modules that need each other.
  `ALLOWED` lists the edges that may close a cycle: only a lazy import whose purpose is an
  optional dependency (none today).
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


# Edges (importer, imported) allowed to close a cycle: lazy imports of a module that exists for an
# optional dependency. Each needs its reason beside it.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def every_import(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module (see the module docstring)."""
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node


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
    """The package's modules that module ``name`` (source in ``path``) imports, anywhere."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()

    def add(candidate: str) -> None:
        # The module itself if it is one, else the nearest enclosing module of the package.
        while candidate and candidate not in known:
            candidate = candidate.rpartition(".")[0]
        if candidate == package or candidate.startswith(package + "."):
            targets.add(candidate)

    for node in every_import(tree.body):
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
    return {t for t in targets if (name, t) not in ALLOWED}


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> Graph:
    """Module -> the package's modules it imports."""
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


def test_every_import_is_an_edge(tmp_path: Path) -> None:
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
        "pkg.a": {"pkg.b", "pkg.sub.d", "pkg.sub.e", "pkg.c", "pkg.z"},
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
            "f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import g\n",
            "g.py": "def later():\n    from . import f\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"], ["pkg.f", "pkg.g", "pkg.f"]]
    assert describe(cycles(graph), "pkg") == "a -> b -> sub.c -> a\nf -> g -> f"
    assert cycles(subpackage_graph(graph, "pkg")) == [["a", "b", "sub", "a"], ["f", "g", "f"]]


# --- the floors of the house ----------------------------------------------------------------------

# Rooms (the top-level modules and subpackages) stand on floors: each above every room it
# imports, so the house is as tall as its longest chain of imports (14 before the datasets
# moved into `dataset/`, docs/adr/0029-the-house-third-round.md).
FLOORS = 12


def floors(graph: Mapping[str, set[str]]) -> dict[str, int]:
    """Each node's floor in an acyclic ``graph``: 1 for a node that imports nothing of it, else
    one above the highest node it imports."""
    found: dict[str, int] = {}

    def floor(node: str) -> int:
        if node not in found:
            found[node] = 1 + max((floor(t) for t in graph.get(node, ())), default=0)
        return found[node]

    for node in graph:
        floor(node)
    return found


def test_floors_count_the_longest_chain() -> None:
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": set()}
    assert floors(graph) == {"a": 3, "b": 2, "c": 1, "d": 1}


def test_the_house_has_at_most_twelve_floors() -> None:
    rooms = subpackage_graph(import_graph())
    height = floors(rooms)
    top = max(height.values())
    chain = [max(height, key=lambda r: height[r])]
    while rooms[chain[-1]]:
        chain.append(max(rooms[chain[-1]], key=lambda r: height[r]))
    assert top <= FLOORS, " -> ".join(chain)


def test_the_table_layer_stands_below_the_datasets() -> None:
    # (`torch_dataloader_utils.iceberg.IcebergDataset`, the earlier name, is handed there by the
    # package root: the table layer needs no dataset.)
    above = {"dataset", "loader", "options", "create"}
    offenders = sorted(
        (module, target)
        for module, targets in import_graph().items()
        if module.split(".")[1:2] == ["iceberg"]
        for target in targets
        if target.split(".")[1:2] and target.split(".")[1] in above
    )
    assert not offenders, offenders
