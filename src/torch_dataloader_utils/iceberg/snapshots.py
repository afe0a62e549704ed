"""Which snapshot a read sees: the current one, a snapshot id, a time, a branch or tag, or the
appends between two snapshots. Resolved once, at planning, and pinned in the plan."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .errors import UnsupportedTableError

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = ["ResolvedSnapshot", "SnapshotSelector"]

# Snapshot ids listed in a "no such snapshot" message.
_LISTED = 10


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class ResolvedSnapshot:
    """The snapshot a read sees.

    Attributes:
        snapshot_id: the snapshot read (the last one of an incremental read); ``None`` when the
            table has no snapshot yet (nothing to read).
        schema: the Iceberg schema rows are read in: the table's current schema for the current
            snapshot and branches, the snapshot's own schema for a snapshot id, a time or a tag
            (Iceberg's rule for time travel).
        from_snapshot_id: the exclusive start of an incremental read, else ``None``.
    """

    snapshot_id: int | None
    schema: Schema
    from_snapshot_id: int | None = None


@dataclass(frozen=True)
class SnapshotSelector:
    """What the user asked to read; checked on construction, resolved by `resolve`.

    Attributes:
        snapshot_id: a snapshot id.
        as_of_ms: the snapshot current at this time (epoch milliseconds, inclusive).
        ref: a branch or tag name.
        from_snapshot_id: read only rows appended after this snapshot (exclusive) up to the
            snapshot selected by the other fields (default: the current one).
    """

    snapshot_id: int | None = None
    as_of_ms: int | None = None
    ref: str | None = None
    from_snapshot_id: int | None = None

    @classmethod
    def of(
        cls,
        *,
        snapshot_id: int | None = None,
        as_of: datetime | int | None = None,
        ref: str | None = None,
        from_snapshot_id: int | None = None,
    ) -> SnapshotSelector:
        """Check the arguments of a read.

        Args:
            snapshot_id: a snapshot id.
            as_of: a ``datetime`` (naive ones are local time, as ``datetime.timestamp`` takes
                them) or epoch milliseconds.
            ref: a branch or tag name.
            from_snapshot_id: the exclusive start of an incremental read of appended rows.

        Raises:
            InvalidArgumentError: more than one of ``snapshot_id``, ``as_of``, ``ref``, or a
                value of the wrong type.
        """
        given = [
            name
            for name, value in (("snapshot_id", snapshot_id), ("as_of", as_of), ("ref", ref))
            if value is not None
        ]
        if len(given) > 1:
            raise InvalidArgumentError(
                f"pass at most one of snapshot_id, as_of and ref to select a snapshot, got {given}"
            )
        for name, value in (("snapshot_id", snapshot_id), ("from_snapshot_id", from_snapshot_id)):
            if value is not None and not _is_int(value):
                raise InvalidArgumentError(f"{name} must be an integer snapshot id, got {value!r}")
        as_of_ms: int | None = None
        if isinstance(as_of, datetime):
            as_of_ms = round(as_of.timestamp() * 1000)
        elif _is_int(as_of):
            as_of_ms = int(as_of)  # type: ignore[arg-type]
        elif as_of is not None:
            raise InvalidArgumentError(
                f"as_of must be a datetime or epoch milliseconds (int), got {as_of!r}"
            )
        if ref is not None and (not isinstance(ref, str) or not ref):
            raise InvalidArgumentError(f"ref must be a branch or tag name, got {ref!r}")
        return cls(
            snapshot_id=int(snapshot_id) if snapshot_id is not None else None,
            as_of_ms=as_of_ms,
            ref=ref,
            from_snapshot_id=int(from_snapshot_id) if from_snapshot_id is not None else None,
        )

    def resolve(self, table: Table, name: str) -> ResolvedSnapshot:
        """The snapshot and schema of ``table`` (named ``name`` in messages) this read sees.

        Raises:
            InvalidArgumentError: no such snapshot, time, branch or tag; or ``from_snapshot_id``
                is not an ancestor of the snapshot read.
            UnsupportedTableError: an incremental read spans a snapshot that is not an append.
        """
        from pyiceberg.table.refs import SnapshotRefType

        metadata = table.metadata
        snapshot: Snapshot | None
        own_schema = True  # time travel reads the snapshot's schema
        if self.snapshot_id is not None:
            snapshot = metadata.snapshot_by_id(self.snapshot_id)
            if snapshot is None:
                known = [s.snapshot_id for s in metadata.snapshots][-_LISTED:]
                raise InvalidArgumentError(
                    f"Iceberg table {name} has no snapshot {self.snapshot_id} (expired, or of "
                    f"another table); its latest snapshots, oldest first: {known}"
                )
        elif self.as_of_ms is not None:
            snapshot = table.snapshot_as_of_timestamp(self.as_of_ms, inclusive=True)
            if snapshot is None:
                log = metadata.snapshot_log
                first = f"; its first snapshot is from {_iso(log[0].timestamp_ms)}" if log else ""
                raise InvalidArgumentError(
                    f"Iceberg table {name} has no snapshot at or before as_of="
                    f"{_iso(self.as_of_ms)}{first}"
                )
        elif self.ref is not None:
            snapshot = table.snapshot_by_name(self.ref)
            if snapshot is None:
                raise InvalidArgumentError(
                    f"Iceberg table {name} has no branch or tag {self.ref!r}; its refs: "
                    f"{sorted(metadata.refs)}"
                )
            own_schema = metadata.refs[self.ref].snapshot_ref_type == SnapshotRefType.TAG
        else:
            snapshot = metadata.current_snapshot()
            own_schema = False
        schema = metadata.schema()
        if own_schema and snapshot is not None and snapshot.schema_id is not None:
            schema = metadata.schema_by_id(snapshot.schema_id) or schema
        if self.from_snapshot_id is None:
            return ResolvedSnapshot(snapshot.snapshot_id if snapshot else None, schema)
        if snapshot is None:
            raise InvalidArgumentError(
                f"Iceberg table {name} has no snapshot: nothing was appended after "
                f"from_snapshot_id={self.from_snapshot_id}"
            )
        self._check_appends(table, snapshot, name)
        return ResolvedSnapshot(snapshot.snapshot_id, schema, self.from_snapshot_id)

    def _check_appends(self, table: Table, last: Snapshot, name: str) -> None:
        """Every snapshot after ``from_snapshot_id`` up to ``last`` is an append."""
        from pyiceberg.table.snapshots import Operation

        start = self.from_snapshot_id
        current: Snapshot | None = last
        while current is not None and current.snapshot_id != start:
            operation = current.summary.operation if current.summary is not None else None
            if operation != Operation.APPEND:
                what = operation.value if operation is not None else "unknown"
                raise UnsupportedTableError(
                    f"Iceberg table {name}: snapshot {current.snapshot_id} between "
                    f"from_snapshot_id={start} and {last.snapshot_id} is an {what!r} operation, "
                    "not an append; an incremental read returns appended rows only and would "
                    "miss its changes. Read the whole snapshot instead (leave out "
                    "from_snapshot_id), or start after it"
                )
            parent = current.parent_snapshot_id
            if parent == start:
                return
            current = table.metadata.snapshot_by_id(parent) if parent is not None else None
        if current is None:
            raise InvalidArgumentError(
                f"Iceberg table {name}: from_snapshot_id={start} is not an ancestor of snapshot "
                f"{last.snapshot_id} (or the history between them was expired)"
            )
