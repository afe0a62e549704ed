"""Loading a table from its catalog (pyiceberg is imported only here and below, lazily)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import InvalidArgumentError, StorageError, StorageNotFoundError
from ..fs import translate_os_error
from .errors import INSTALL_HINT, MissingDependencyError

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = ["CATALOG_NAME_KEY", "TableName", "load_table", "require_pyiceberg", "table_name"]

# The key of ``catalog_config`` that names the catalog; every other key is a catalog property.
CATALOG_NAME_KEY = "name"

TableName = str | Sequence[str]


def require_pyiceberg() -> None:
    """Check that pyiceberg is installed, before any work is done.

    Raises:
        MissingDependencyError: it is not; the message names the pip extra.
    """
    try:
        found = importlib.util.find_spec("pyiceberg") is not None
    except ValueError:  # a module set to None in sys.modules (how tests hide it)
        found = False
    if not found:
        raise MissingDependencyError(
            f"reading Iceberg tables needs pyiceberg, which is not installed: {INSTALL_HINT}"
        )


def table_name(table: TableName) -> str:
    """``table`` as the dotted name messages and fingerprints use.

    Raises:
        InvalidArgumentError: ``table`` is neither a dotted name nor a sequence of names.
    """
    if isinstance(table, str):
        parts = [table]
    elif isinstance(table, Sequence) and all(isinstance(p, str) for p in table):
        parts = list(table)
    else:
        raise InvalidArgumentError(
            f'table must be a name such as "db.events" (or a tuple of names), got {table!r}'
        )
    name = ".".join(parts)
    if not name or any(not p for p in name.split(".")):
        raise InvalidArgumentError(f'table must be a name such as "db.events", got {table!r}')
    return name


def load_table(table: TableName, catalog_config: Mapping[str, Any] | None) -> Table:
    """Load ``table`` through ``pyiceberg.catalog.load_catalog(name, **properties)``.

    ``catalog_config[CATALOG_NAME_KEY]`` names the catalog (default: pyiceberg's default name,
    ``"default"`` unless ``PYICEBERG_DEFAULT_CATALOG`` says otherwise), whose properties pyiceberg
    also reads from ``~/.pyiceberg.yaml`` and ``PYICEBERG_CATALOG__<NAME>__*`` variables; every
    other key is a catalog property (``type``, ``uri``, ``warehouse``, ``s3.endpoint``, ...) and
    wins over those. Messages never show property values (they may be secrets).

    Raises:
        InvalidArgumentError: the catalog configuration is incomplete or malformed.
        StorageNotFoundError: the namespace or table does not exist.
        StorageError: the catalog could not be reached.
    """
    require_pyiceberg()
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import (
        NoSuchIdentifierError,
        NoSuchNamespaceError,
        NoSuchTableError,
    )

    name = table_name(table)
    properties = dict(catalog_config or {})
    catalog_name = properties.pop(CATALOG_NAME_KEY, None)
    where = f"Iceberg catalog {catalog_name or '(default)'}"
    try:
        catalog = load_catalog(catalog_name, **properties)
    except (ValueError, TypeError, KeyError) as exc:
        keys = sorted(properties)
        raise InvalidArgumentError(
            f"{where}: cannot load it from catalog_config with keys {keys}: "
            f"{_redacted(exc, properties)}. Pass the "
            'catalog properties, e.g. {"type": "rest", "uri": "https://..."} or '
            '{"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file:///warehouse"}'
        ) from exc
    except OSError as exc:
        raise translate_os_error(exc, where) from exc
    except Exception as exc:
        if _is_database_error(exc):
            raise StorageError(
                f"{where}: the catalog database cannot be reached ({_redacted(exc, properties)})"
            ) from exc
        raise
    identifier = tuple(table) if not isinstance(table, str) else name
    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError, NoSuchIdentifierError) as exc:
        raise StorageNotFoundError(f"{where}: table {name} does not exist ({exc})") from exc
    except OSError as exc:
        raise translate_os_error(exc, f"{where}, table {name}") from exc
    except Exception as exc:
        if _is_database_error(exc):
            raise StorageError(
                f"{where}, table {name}: the catalog database cannot be reached "
                f"({_redacted(exc, properties)})"
            ) from exc
        raise


def _redacted(exc: BaseException, properties: Mapping[str, Any]) -> str:
    """``exc``'s message with every catalog_config value longer than 3 characters masked:
    pyiceberg and SQLAlchemy quote URIs, which can hold passwords."""
    text = str(exc)
    values = {str(v) for v in properties.values() if isinstance(v, str | int) and len(str(v)) > 3}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "***")
    # A URI's password also appears on its own (SQLAlchemy renders URLs with it masked or not).
    for value in values:
        parsed = urlsplit(value)
        if parsed.password and len(parsed.password) > 3:
            text = text.replace(parsed.password, "***")
    return text


def _is_database_error(exc: BaseException) -> bool:
    """A SQL catalog's database failure (SQLAlchemy's errors are not OSError)."""
    return any(t.__module__.startswith("sqlalchemy") for t in type(exc).__mro__)
