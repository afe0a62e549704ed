"""Every name a benchmark imports from the library exists: a benchmark imports inside its
functions too (``benchmarks/memory.py`` imported a Thrift helper that had moved, and failed
only when run), and no test runs the benchmarks whole."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


def _library_imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` of each ``from torch_dataloader_utils... import name`` in ``path``,
    wherever it sits (``*``: the module alone)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "torch_dataloader_utils"
        ):
            assert node.module is not None
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (alias.name, "*")
                for alias in node.names
                if alias.name.startswith("torch_dataloader_utils")
            ]
    return found


def test_the_benchmarks_are_found() -> None:
    assert len(BENCHMARKS) > 20
    assert any(_library_imports(path) for path in BENCHMARKS)


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_what_a_benchmark_imports_from_the_library_exists(path: Path) -> None:
    for module, name in _library_imports(path):
        imported = importlib.import_module(module)
        if name == "*":
            continue
        assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), (
            f"{path.name}: {module} has no {name}"
        )
