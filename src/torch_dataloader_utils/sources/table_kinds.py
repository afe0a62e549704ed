"""The table registry: table kinds by name, each a ``"module:attr"`` factory imported on first use.

As the format registry (`formats.registry`) does for formats: nothing is imported until a kind is
asked for, so importing the package imports no table library (pyiceberg is imported when an
Iceberg table is read). An entry also says how a source names a table of its kind
(`TableEntry.address`), which the dataset decides from without importing the kind.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import InvalidArgumentError, MissingDependencyError, UnknownFormatError
from .tables import TableKind

__all__ = [
    "Address",
    "TableEntry",
    "available_tables",
    "register_table",
    "table_entry",
    "table_kind",
]

Address = Literal["name", "path"]
Factory = Callable[[], TableKind]


@dataclass(frozen=True)
class TableEntry:
    """A registered table kind.

    Attributes:
        name: the kind's name (lower case), as ``format=`` names it.
        target: ``"module:attr"``, the factory (a `TableKind` class, or a function returning
            one) imported on first use; or the factory itself.
        address: how a source names a table of this kind: by ``"name"`` in a catalog
            (``Source(table="db.events")``), or by ``"path"``, its location
            (``Source("s3://bucket/table", format=name)``).
    """

    name: str
    target: str | Factory
    address: Address


_REGISTRY: dict[str, TableEntry] = {
    "iceberg": TableEntry("iceberg", "torch_dataloader_utils.iceberg.table:IcebergTables", "name"),
    "delta": TableEntry("delta", "torch_dataloader_utils.delta.table:DeltaTables", "path"),
    "lance": TableEntry("lance", "torch_dataloader_utils.lance.table:LanceTables", "path"),
}
_lock = threading.Lock()


def register_table(
    name: str, target: str | Factory, *, address: Address = "path", clobber: bool = False
) -> None:
    """Register a table kind under ``name``: its folder and this one entry are all a new kind
    needs (see the how-to "Add a source").

    Registering imports nothing: a ``"module:attr"`` target is imported when a table of the
    kind is first read.

    Args:
        name: the kind's name (case-insensitive): ``format=`` of a source read by path, and
            the ``format`` of its plans' fingerprints.
        target: ``"module:attr"`` (``attr`` may be dotted) naming a factory that takes no
            argument and returns a `TableKind` (its class, typically), or the factory itself.
        address: ``"path"``: its tables are read by location (``Source(path, format=name)``);
            ``"name"``: by name in a catalog (``Source(table=..., format=name)``).
        clobber: replace the kind registered under ``name``. Registering the same target
            again is allowed without it.

    Raises:
        InvalidArgumentError: an empty ``name``, a ``target`` that is not ``"module:attr"`` nor
            callable, an unknown ``address``, or ``name`` taken by another kind and not
            ``clobber``.

    Example:
        >>> from torch_dataloader_utils.sources.table_kinds import register_table
        >>> register_table("mytable", "my_package.tables:MyTables")  # doctest: +SKIP
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(
            f"register_table: the name must be a non-empty str, got {name!r}"
        )
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        if not module or not attribute or ":" in attribute:
            raise InvalidArgumentError(
                f"register_table({name!r}, {target!r}): the target must be 'module:attr'"
            )
    elif not callable(target):
        raise InvalidArgumentError(
            f"register_table({name!r}, ...): the target must be 'module:attr' or a factory of "
            f"a TableKind, got {target!r}"
        )
    if address not in ("name", "path"):
        raise InvalidArgumentError(
            f'register_table({name!r}, ...): address must be "name" or "path", got {address!r}'
        )
    key = name.lower()
    entry = TableEntry(key, target, address)
    with _lock:
        taken = _REGISTRY.get(key)
        if taken is not None and taken != entry and not clobber:
            raise InvalidArgumentError(
                f"table kind {key!r} is registered already (as {taken.target!r}); pass "
                "clobber=True to replace it"
            )
        _REGISTRY[key] = entry


def available_tables() -> list[str]:
    """Names of the registered table kinds."""
    return sorted(_REGISTRY)


def table_entry(name: str) -> TableEntry | None:
    """The kind registered under ``name`` (``None``: none), without importing it."""
    return _REGISTRY.get(name.lower())


def table_kind(name: str) -> TableKind:
    """The kind registered under ``name``, made by its factory (imported now if need be).

    Raises:
        UnknownFormatError: no kind has that name, or its factory cannot be imported.
        MissingDependencyError: the kind's library is not installed (the message names the
            pip extra).
    """
    entry = table_entry(name)
    if entry is None:
        raise UnknownFormatError(
            f"unknown table kind {name!r}; available: {', '.join(available_tables())}"
        )
    factory = entry.target
    if isinstance(factory, str):
        factory = _imported(entry.name, factory)
    return factory()


def _imported(name: str, target: str) -> Factory:
    module, _, attribute = target.partition(":")
    try:
        found: object = importlib.import_module(module)
        found = functools.reduce(getattr, attribute.split("."), found)
    except MissingDependencyError:
        raise  # ours: it names the extra to install
    except (ImportError, AttributeError) as exc:
        raise UnknownFormatError(
            f"table kind {name!r} is registered as {target!r}, which cannot be loaded: {exc}"
        ) from exc
    if not callable(found):
        raise UnknownFormatError(
            f"table kind {name!r} is registered as {target!r}, which is not callable"
        )
    return found
