"""Parquet files whose column names repeat or are empty, read under the unique names
(`names`): pyarrow is asked for the file's names, its columns renamed by position."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import pyarrow as pa

from ...errors import CorruptFileError
from ..names import unique_names, unique_schema
from .leafless import leaf_count

__all__ = ["Ask", "Renaming", "asked"]


class Ask(NamedTuple):
    """A read of some unique-named columns of a file whose names are not unique."""

    asked: list[str] | None  # the file's names asked of pyarrow (None: all)
    given: list[str]  # the file's names of the columns pyarrow gives, in its order
    renamed: list[str]  # their unique names
    keep: list[str] | None  # the columns read, in their order (None: all given)


class Renaming:
    """How a file whose column names repeat or are empty is read under the unique names
    (`names`).

    pyarrow selects columns by the file's names and gives every column of a name asked, in the
    order asked, each name's in file order (leaving out those without leaf columns,
    `leafless`): its columns are renamed by position, then those asked selected.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.names = tuple(schema.names)
        self.unique = unique_names(self.names)
        self._stored = [bool(leaf_count(field.type)) for field in schema]
        self._position = {name: i for i, name in enumerate(self.unique)}
        self._sharing: dict[str, list[int]] = {}  # the positions of each name of the file
        for i, name in enumerate(self.names):
            self._sharing.setdefault(name, []).append(i)
        self._asks: dict[tuple[str, ...] | None, Ask] = {}  # a plan reads one or two

    @staticmethod
    def of(schema: pa.Schema) -> Renaming | None:
        """The renaming of a file of ``schema``; ``None`` when its names are unique."""
        return None if unique_schema(schema) is schema else Renaming(schema)

    def ask(self, columns: tuple[str, ...] | None) -> Ask:
        """How to read ``columns`` (unique names; None: all)."""
        found = self._asks.get(columns)
        if found is not None:
            return found
        if columns is None:
            asked, positions = None, list(range(len(self.names)))
        else:
            asked = list(dict.fromkeys(self.names[self._position[c]] for c in columns))
            positions = [i for name in asked for i in self._sharing[name]]
        given = [i for i in positions if self._stored[i]]
        renamed = [self.unique[i] for i in given]
        kept = set(renamed)
        keep = None if columns is None else [c for c in columns if c in kept]
        found = Ask(asked, [self.names[i] for i in given], renamed, keep)
        self._asks[columns] = found
        return found

    def rename(
        self, batches: Iterator[pa.RecordBatch], columns: tuple[str, ...] | None, where: str
    ) -> Iterator[pa.RecordBatch]:
        """``batches`` read as `ask` says for ``columns``, under unique names, of ``columns``
        in their order (those without leaf columns are `put_back` later)."""
        ask = self.ask(columns)
        for batch in batches:
            if batch.schema.names != ask.given:  # renaming by position must pair right
                raise CorruptFileError(
                    f"{where}: pyarrow read columns {batch.schema.names}, expected {ask.given}"
                )
            renamed = batch.rename_columns(ask.renamed)
            yield renamed if ask.keep is None else renamed.select(ask.keep)


def asked(renaming: Renaming | None, columns: tuple[str, ...] | None) -> list[str] | None:
    """The file's names to ask pyarrow for ``columns`` (the plan's unique names)."""
    if columns is None or renaming is None:
        return None if columns is None else list(columns)
    return renaming.ask(columns).asked
