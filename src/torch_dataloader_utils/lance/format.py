"""The Lance `Format`: reads a plan's chunks (units of a fragment's live rows) with pylance.

A chunk of a Lance plan is a range of units of one fragment, counted in live rows (rows left
after the fragment's deletion file): pylance's ``offset`` and ``limit`` count live rows too, so
live rows ``[a, b)`` are read as they are, deletions applied by pylance. Each process opens the
dataset at the pinned version itself and keeps it (`HandleCache`): a dataset opened in the
parent is never used in a forked worker. The row filter is the dataset's to apply, as for
every format. A worker forked from a process that had imported pylance reads through a reader
process of its own instead (`fork_reads`): pylance is not fork-safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from ..errors import CorruptFileError
from ..formats import ReadOptions
from ..formats.handles import HandleCache
from ..fs import FileSystemSpec, ListedFile
from ..planning import Chunk
from ..sources.tables import TableFormat
from .fork_reads import forked_after_lance, read_forked
from .opening import open_dataset
from .options import FragmentInfo, LanceReadOptions
from .storage import lance_storage_options

if TYPE_CHECKING:
    from lance import LanceDataset

__all__ = ["LanceFormat"]

# Datasets (uri, version) a process keeps open: a stream reads one or two at a time.
_DATASETS = 4
# Rows pylance decodes a batch (its default is 8192; smaller keeps a worker's memory flat).
_BATCH_ROWS = 8192


class LanceFormat(TableFormat[LanceReadOptions]):
    """Fragments of a Lance dataset at a pinned version, read by live row.

    Stateless apart from the datasets each process opens (dropped when pickled and on
    `close`).
    """

    name = "lance"
    options_type = LanceReadOptions
    planned_from = "a Lance dataset is planned from its manifest"
    read_as = 'read its folder with create_dataloader("data/train.lance", format="lance")'

    def __init__(self) -> None:
        self._opened: HandleCache[tuple[str, int], LanceDataset] = HandleCache(_DATASETS)

    def __reduce__(self) -> tuple[type[LanceFormat], tuple[()]]:
        return (type(self), ())  # datasets stay behind: each process opens its own

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        """The schema of one Lance data file (its own columns).

        Raises:
            CorruptFileError: the file cannot be parsed.
        """
        from lance.file import LanceFileReader

        try:
            return LanceFileReader(fs.url(file.path)).metadata().schema
        except (ValueError, OSError) as exc:
            raise CorruptFileError(f"{fs.url(file.path)}: not a Lance data file: {exc}") from exc

    def _dataset(self, options: LanceReadOptions, fs: FileSystemSpec) -> LanceDataset:
        """The dataset at the pinned version, opened by this process (kept) with its own
        storage options (``fs``'s)."""

        def open_pinned() -> LanceDataset:
            label = f"Lance dataset {options.table}"
            storage = lance_storage_options(fs, label)
            return open_dataset(options.uri, options.version, label, storage)

        return self._opened.get((options.uri, options.version), open_pinned)

    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        """Live rows ``[row_start, row_stop)`` of ``chunk``, in the dataset's schema, in order.

        Raises:
            StorageNotFoundError: the dataset is gone.
            InvalidArgumentError: its pinned version is gone (cleaned up since planning).
            CorruptFileError: the fragment holds fewer live rows than planned, or pylance
                cannot decode it.
        """
        opts = self.table_options(options)
        stop = min(row_stop, chunk.num_rows)
        if row_start >= stop:
            return
        info = opts.file(chunk.path)
        offset = info.first_row(chunk.start) + row_start
        where = f"{fs.url(chunk.path)} (fragment {info.fragment_id} of Lance dataset {opts.table} "
        where += f"at version {opts.version})"
        wanted, got = stop - row_start, 0
        for batch in self._batches(opts, fs, info, (offset, wanted), where):
            got += batch.num_rows
            if batch.num_rows:
                yield batch
        if got != wanted:
            raise CorruptFileError(
                f"{where}: live rows {offset}:{offset + wanted} read {got} rows, planned "
                f"{wanted}; create the loader again to plan the dataset as it is now"
            )

    def _batches(
        self,
        opts: LanceReadOptions,
        fs: FileSystemSpec,
        info: FragmentInfo,
        rows: tuple[int, int],
        where: str,
    ) -> Iterator[pa.RecordBatch]:
        """Live rows ``[offset, offset + limit)`` (``rows``) of the fragment, read by pylance here
        or, in a worker forked after pylance was imported, by one of this process's reader
        processes."""
        offset, limit = rows
        columns = None if opts.columns is None else list(opts.columns)
        if forked_after_lance():
            request = {
                "uri": opts.uri,
                "storage_options": lance_storage_options(fs, f"Lance dataset {opts.table}"),
                "version": opts.version,
                "fragment": info.fragment_id,
                "columns": columns,
                "offset": offset,
                "limit": limit,
                "batch_rows": _BATCH_ROWS,
            }
            yield from read_forked(request, where)
            return
        fragment = self._dataset(opts, fs).get_fragment(info.fragment_id)
        if fragment is None:
            raise CorruptFileError(f"{where}: no such fragment at that version")
        try:
            yield from fragment.to_batches(
                columns=columns, offset=offset, limit=limit, batch_size=_BATCH_ROWS
            )
        except (ValueError, OSError) as exc:
            raise CorruptFileError(f"{where}: cannot be read: {exc}") from exc

    def close(self) -> None:
        self._opened.clear()  # (reader processes, if any, live as long as this process)
