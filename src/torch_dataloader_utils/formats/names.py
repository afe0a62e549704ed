"""Unique column names for files whose columns repeat a name or have none.

Columns are selected and keyed by name, so every column needs its own. As pandas, polars and
duckdb do, such files are read with deterministic new names; the rule is duckdb's:

- names are taken in file order; an empty name becomes ``column{i}`` (``i``: its 0-based
  position);
- a name already taken becomes ``{name}_{k}`` with the smallest ``k >= 1`` that is neither a
  name of the file nor one already given.

The first column of a name keeps it, and so does every column whose name is unique: only the
repeats and the empty names change. Each file read with new names warns once (`warn_renamed`),
naming the file and the renames.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import pyarrow as pa

from ..errors import TorchDataloaderUtilsWarning

__all__ = ["RenamedColumnsWarning", "renames", "unique_names", "unique_schema", "warn_renamed"]


class RenamedColumnsWarning(TorchDataloaderUtilsWarning):
    """A file's columns repeat a name or have none: they are read under new names."""


def unique_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` made unique by the module's rule (unchanged when they are)."""
    if len(set(names)) == len(names) and all(names):
        return tuple(names)
    taken = set(names)  # a new name never takes a name of the file
    given: set[str] = set()
    out = []
    for i, name in enumerate(names):
        new = name if name else f"column{i}"
        if new in given or (not name and new in taken):
            k = 1
            while f"{new}_{k}" in taken or f"{new}_{k}" in given:
                k += 1
            new = f"{new}_{k}"
        given.add(new)
        out.append(new)
    return tuple(out)


def renames(names: Sequence[str]) -> list[tuple[int, str, str]]:
    """``(position, old, new)`` of each column `unique_names` renames."""
    new = unique_names(names)
    return [(i, old, n) for i, (old, n) in enumerate(zip(names, new, strict=True)) if old != n]


def unique_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its top-level names made unique (the same object when they are)."""
    names = unique_names(schema.names)
    if tuple(schema.names) == names:
        return schema
    return pa.schema(
        [f.with_name(n) for f, n in zip(schema, names, strict=True)], metadata=schema.metadata
    )


def warn_renamed(url: str, names: Sequence[str], *, stacklevel: int = 2) -> None:
    """Warn that ``url``'s columns are read under new names, naming each rename."""
    found = renames(names)
    if not found:
        return
    told = ", ".join(f"#{i} {old!r} -> {new!r}" for i, old, new in found)
    warnings.warn(
        f"{url}: columns repeat a name or have none; read as: {told} (columns= and filters "
        "use the new names)",
        RenamedColumnsWarning,
        stacklevel=stacklevel + 1,
    )
