"""A packed dataset's token counts from Parquet footers, where a footer tells them exactly.

The leaf column chunk of a list column stores one level per slot: a value, a null element, an
empty list and a null list each take one (the footer's ``num_values``). A slot's definition
level says which it is: below the list's level (1 for a nullable list, else 0) a null list, at
it an empty list, above it an element (a null one just below the maximum, where elements are
nullable). The tokens of a row group, as reading counts them (`sources.counting.count_tokens`,
``list_value_length``: a null element counts), are its slots above the list's level; its
documents (lists not null) are its rows less its slots below.

Two footer fields tell these, and only these two are used:

- the definition level histogram (``size_statistics``, PARQUET-2261): exact by its definition.
  Not used at a maximum level of 1, where Arrow C++ wrote wrong histograms past 16,384 levels
  (apache/arrow#50778); checked against the values and, from a writer below, the null count.
- the statistics' null count, which counts the slots below the maximum level in the files of the
  writers `_NULLS_COUNTED` names. Older writers counted null elements only, not null or empty
  lists (parquet-cpp before Arrow 6: PARQUET-2067, apache/arrow#42980; parquet-testing's
  ``list_columns.parquet`` counts 1 of 2); other writers are not trusted. With nullable
  elements it mixes null elements with null and empty lists, so it tells the tokens only when it
  is 0 (or the elements are required), and the documents only when it is 0 (or the list is).

Anything else (no such field, a large list, a writer not named): `None`, counted by reading.
The evidence: docs/adr/0022-packed-sequences.md#token-counts-from-parquet-footers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from .footer import ColumnFacts
from .thrift import ThriftError, integer_field, integers_field

__all__ = [
    "TokenLeaf",
    "Told",
    "chunk_tokens",
    "definition_levels",
    "from_levels",
    "from_null_count",
    "null_count",
    "nulls_counted",
    "row_group_tokens",
    "token_leaf",
]

# (tokens, documents): a row group's or chunk's values of the list column and its lists that are
# not null; documents ``None`` where only the tokens are told.
Told = tuple[int, int | None]

# Writers whose null count counts every slot below the maximum definition level, from the
# version given: Arrow C++ from the first release after PARQUET-2067's fix (merged 2021-10-06);
# parquet-mr and parquet-rs as far back as the real-world files show (1.8.0, 9.0.0).
_NULLS_COUNTED = {
    "parquet-cpp-arrow": (7, 0, 0),
    "parquet-mr": (1, 8, 0),
    "parquet-java": (1, 8, 0),
    "parquet-rs": (9, 0, 0),
}
_CREATED_BY = re.compile(r"(\S+) version (\d+)\.(\d+)\.(\d+)")


def nulls_counted(created_by: str | None) -> bool:
    """Whether the writer ``created_by`` (the footer's) counts null and empty lists as nulls."""
    found = _CREATED_BY.match(created_by or "")
    if found is None:
        return False
    least = _NULLS_COUNTED.get(found.group(1))
    version = (int(found.group(2)), int(found.group(3)), int(found.group(4)))
    return least is not None and version >= least


@dataclass(frozen=True, slots=True)
class TokenLeaf:
    """The leaf column of a token list column, and how its definition levels read.

    Attributes:
        index: the leaf column's position among the file's leaf columns.
        list_level: the level of a list that is present (empty): 1 if the list is nullable.
        max_level: the maximum definition level (a present element).
        nulls_counted: the writer's null count counts every slot below ``max_level``.
    """

    index: int
    list_level: int
    max_level: int
    nulls_counted: bool


def token_leaf(
    schema: pa.Schema, owners: list[str], column: str, created_by: str | None
) -> TokenLeaf | None:
    """The leaf of ``column`` when it is a list (not a large list) of integers, else ``None``.

    Nullability is the Parquet schema's: pyarrow takes it from the repetitions, never from a
    stored Arrow schema.
    """
    if column not in schema.names:
        return None
    kind = schema.field(column).type
    if not pa.types.is_list(kind) or not pa.types.is_integer(kind.value_type):
        return None
    list_level = int(schema.field(column).nullable)
    return TokenLeaf(
        owners.index(column),  # a list of integers has one leaf column
        list_level,
        list_level + 1 + int(kind.value_field.nullable),
        nulls_counted(created_by),
    )


def row_group_tokens(leaf: TokenLeaf, rows: int, column: ColumnFacts, thrift: bytes) -> Told | None:
    """The tokens and documents of a row group of ``rows`` whose token column chunk is
    ``column`` (in the footer ``thrift``), or ``None`` where the footer does not tell them."""
    slots = column.values
    if slots is None or slots < rows:  # each row takes a slot at least
        return None
    nulls = null_count(thrift, column.statistics)
    if nulls is not None and not 0 <= nulls <= slots:
        nulls = None
    told = from_levels(leaf, rows, slots, definition_levels(thrift, column.sizes), nulls)
    return told if told is not None else from_null_count(leaf, rows, slots, nulls)


def from_levels(
    leaf: TokenLeaf, rows: int, slots: int, levels: tuple[int, ...] | None, nulls: int | None
) -> Told | None:
    """What the definition level histogram ``levels`` tells (see the module's docstring)."""
    if (
        levels is None
        or leaf.max_level < 2
        or len(levels) != leaf.max_level + 1
        or min(levels) < 0
        or sum(levels) != slots
        or (leaf.nulls_counted and nulls is not None and nulls != slots - levels[-1])
    ):
        return None
    null_lists = sum(levels[: leaf.list_level])
    if null_lists > rows:
        return None
    return sum(levels[leaf.list_level + 1 :]), rows - null_lists


def from_null_count(leaf: TokenLeaf, rows: int, slots: int, nulls: int | None) -> Told | None:
    """What the null count ``nulls`` tells (see the module's docstring)."""
    if nulls is None or not leaf.nulls_counted:
        return None
    if nulls and leaf.max_level > leaf.list_level + 1:  # null elements among the nulls
        return None
    return slots - nulls, rows if leaf.list_level == 0 or not nulls else None


def chunk_tokens(
    start: int, stop: int, num_rows: int, groups: Mapping[int, tuple[int, Told | None]]
) -> Told | None:
    """The tokens and documents of a chunk of row groups ``[start, stop)`` and ``num_rows``
    rows, from each row group's rows and told counts in ``groups``: ``None`` if one is untold,
    or if the chunk is not those row groups whole (footers count whole row groups)."""
    tokens = rows = 0
    documents: int | None = 0
    for group in range(start, stop):
        if group not in groups:
            return None
        n, one = groups[group]
        if one is None:
            return None
        rows += n
        tokens += one[0]
        documents = None if documents is None or one[1] is None else documents + one[1]
    return (tokens, documents) if rows == num_rows else None


def null_count(thrift: bytes, at: int | None) -> int | None:
    """Statistics' null count (field 3) at ``at`` (``None``: none, or not decodable)."""
    try:
        return None if at is None else integer_field(thrift, at, 3, 4)[0]
    except (ThriftError, IndexError):
        return None


def definition_levels(thrift: bytes, at: int | None) -> tuple[int, ...] | None:
    """Size statistics' definition level histogram (field 3) at ``at`` (``None`` likewise)."""
    try:
        return None if at is None else integers_field(thrift, at, 3, 4)[0]
    except (ThriftError, IndexError):
        return None
