"""Arrow IPC: chunks are record-batch ranges of IPC files (Feather v2) and IPC streams.

Row counts live in each record batch's message header, not in the file footer, and pyarrow
decodes (and decompresses) a whole batch to tell its rows. Planning therefore reads only the
message headers: the footer's block list (file format) or a walk over the messages (stream
format), both parsed from their flatbuffers by `messages`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyarrow import ipc

from ...errors import CorruptFileError
from ...fs import FileSystemSpec, ListedFile
from ...planning import Chunk
from ..base import Format, FormatPlan, Listing, ReadOptions
from ..chunking import file_chunks
from ..handles import HandleCache
from ..magic import refuse_other_format
from ..names import unique_names, unique_schema, warn_renamed
from ..opening import each_file, open_input, parsing, read_range, slice_batches
from ..schemas import FileSchema, check_schemas
from .messages import KIND, MAGIC, RECORD_BATCH, Headers, read_headers

__all__ = ["IpcFormat"]

# Open files (file format) or message walks (stream format) kept per worker.
_OPEN_FILES = 1
# Files whose format (file or stream) a worker remembers.
_KINDS = 4096


def _included(schema: pa.Schema, columns: tuple[str, ...] | None) -> list[int] | None:
    if columns is None:
        return None
    names = unique_names(schema.names)  # columns are named by the unique names
    return sorted(names.index(c) for c in columns)


def _batch_names(schema: pa.Schema, included: list[int] | None) -> list[str] | None:
    """The unique names of the columns a read of ``included`` yields, or None when the
    file's names are unique already (batches keep them)."""
    names = unique_names(schema.names)
    if names == tuple(schema.names):
        return None
    return [names[i] for i in (included if included is not None else range(len(names)))]


def _headers(file: ListedFile, fs: FileSystemSpec) -> Headers:
    try:
        return fs.request(lambda: read_headers(file.path, file.size, fs), what=fs.url(file.path))
    except CorruptFileError as exc:  # say so when it is another format
        refuse_other_format(file, fs, "Arrow IPC", exc)
        raise


class IpcFormat(Format):
    """Apache Arrow IPC: the file format (Feather v2, ``pyarrow.ipc.new_file``) and the stream
    format (``pyarrow.ipc.new_stream``, as Hugging Face ``datasets`` caches are written).

    A chunk is a record batch, or consecutive batches grouped to ``split_bytes``/
    ``split_rows``. Planning reads message headers only, never batch bodies: an IPC file's
    footer and its batches' headers; a stream's headers in one pass over its messages. The
    file format is read with random access (``get_batch``), only the projected columns' buffers
    decoded. A stream has no index: a reader walks its headers once per file and process (the
    walk is cached, `_OPEN_FILES` at a time), then reads the schema message, every dictionary
    message before the first batch wanted, and the batches wanted: no batch before them is
    downloaded or decoded. Feather v1 files are refused with how to convert them.
    """

    name = "ipc"

    def __init__(self) -> None:
        # Per process (a forked child opens its own, see `HandleCache`): open files by
        # projection, streams' message walks, and whether each file is a stream.
        self._open: HandleCache[
            tuple[str, tuple[str, ...] | None],
            tuple[ipc.RecordBatchFileReader, pa.NativeFile, list[str] | None],
        ] = HandleCache(_OPEN_FILES, lambda opened: opened[1].close())
        self._headers: HandleCache[str, Headers] = HandleCache(_OPEN_FILES)
        self._kinds: HandleCache[str, bool] = HandleCache(_KINDS)

    def __reduce__(self) -> tuple[type[IpcFormat], tuple[()]]:
        return (type(self), ())  # open files stay behind: each process opens its own

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        return unique_schema(_headers(file, fs).schema)

    per_file = True  # (`Format.plan`: each file's facts, assembled)

    def facts(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> list[Any]:
        return each_file(lambda f: _headers(f, fs), listing.files)

    def assemble(
        self, listing: Listing, facts: Sequence[Any], fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        files = listing.files
        headers = facts
        for f, x in zip(files, headers, strict=True):
            warn_renamed(fs.url(f.path), x.schema.names, stacklevel=4)
        schema = check_schemas(
            files,
            [FileSchema(unique_schema(x.schema), any(b.rows for b in x.batches)) for x in headers],
            fs,
            options,
        )
        units = [[(i, b.rows, b.size) for i, b in enumerate(x.batches)] for x in headers]
        chunks = file_chunks(listing, units, options)
        rows = sum(b.rows for x in headers for b in x.batches)
        size = sum(b.size for x in headers for b in x.batches)
        # Uncompressed bodies are the decoded buffers; compressed ones make this a low estimate.
        row_bytes = max(size / rows if rows else 1.0, 1.0)
        return FormatPlan(chunks=chunks, schema=schema, row_bytes=row_bytes)

    def _is_stream(self, path: str, fs: FileSystemSpec) -> bool:
        """Whether ``path`` is in the stream format (remembered per process: one small read)."""
        # A planned file has rows: it is no shorter than the magic.
        return self._kinds.get(
            path, lambda: not read_range(path, 0, len(MAGIC), fs).startswith(MAGIC)
        )

    def _size(self, path: str, fs: FileSystemSpec) -> int:
        def size() -> int:
            with open_input(path, fs) as opened:
                return int(opened.size())

        return fs.request(size, what=fs.url(path))

    def _stream(self, path: str, fs: FileSystemSpec) -> Headers:
        def walk() -> Headers:
            size = self._size(path, fs)
            return fs.request(lambda: read_headers(path, size, fs), what=fs.url(path))

        return self._headers.get(path, walk)

    def _file(
        self, path: str, columns: tuple[str, ...] | None, fs: FileSystemSpec
    ) -> tuple[ipc.RecordBatchFileReader, pa.NativeFile, list[str] | None]:
        """The open file, projected to ``columns``, and the unique names of its batches'
        columns (None: the file's own)."""

        def open_file() -> tuple[ipc.RecordBatchFileReader, pa.NativeFile, list[str] | None]:
            opened = open_input(path, fs)
            try:
                with parsing(fs.url(path), KIND):
                    reader = ipc.open_file(opened)
                    schema = reader.schema
                    included = _included(schema, columns)
                    if included is not None:  # only the projected columns' buffers are read
                        reader = ipc.open_file(
                            opened, options=ipc.IpcReadOptions(included_fields=included)
                        )
                    return reader, opened, _batch_names(schema, included)
            except BaseException:  # corrupt, or the storage failed mid-parse
                opened.close()
                raise

        return self._open.get((path, columns), open_file)

    def _read_file(
        self, path: str, indices: list[int], columns: tuple[str, ...] | None, fs: FileSystemSpec
    ) -> Iterator[pa.RecordBatch]:
        reader, _, names = self._file(path, columns, fs)
        for index in indices:
            with parsing(f"{fs.url(path)} record batch {index}", KIND):
                batch = reader.get_batch(index)
            yield batch if names is None else batch.rename_columns(names)

    def _read_stream(
        self, path: str, indices: list[int], columns: tuple[str, ...] | None, fs: FileSystemSpec
    ) -> Iterator[pa.RecordBatch]:
        """Batches ``indices`` (consecutive) of a stream: its schema message, the dictionary
        messages before them, and their own messages, read as one stream."""
        headers = self._stream(path, fs)
        url = fs.url(path)
        if indices[-1] >= len(headers.batches):
            raise CorruptFileError(
                f"{url}: has {len(headers.batches)} record batches, the plan reads batch "
                f"{indices[-1]}; the file changed since it was planned"
            )
        first, last = headers.batches[indices[0]], headers.batches[indices[-1]]
        ranges = [  # the schema and the dictionaries in force at the first batch
            (m.offset, m.size)
            for m in headers.messages
            if m.offset < first.offset and m.kind != RECORD_BATCH
        ]
        ranges.append((first.offset, last.offset + last.size - first.offset))
        data = b"".join(read_range(path, offset, size, fs) for offset, size in ranges)
        included = _included(headers.schema, columns)
        names = _batch_names(headers.schema, included)
        where = f"{url} record batches {indices[0]}:{indices[-1] + 1}"
        with parsing(where, KIND):
            reader = ipc.open_stream(
                pa.py_buffer(data), options=ipc.IpcReadOptions(included_fields=included)
            )
            for batch in reader:
                yield batch if names is None else batch.rename_columns(names)

    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        first = 0  # row of the chunk where the current batch starts
        spans = []  # (batch index, first row of the chunk in it)
        for index, rows in zip(range(chunk.start, chunk.stop), chunk.unit_rows, strict=True):
            if max(row_start, first) < min(row_stop, first + rows):
                spans.append((index, first))
            first += rows
        if not spans:
            return
        indices = [i for i, _ in spans]
        columns = options.columns
        if self._is_stream(chunk.path, fs):
            batches = self._read_stream(chunk.path, indices, columns, fs)
        else:
            batches = self._read_file(chunk.path, indices, columns, fs)
        where = f"{fs.url(chunk.path)} record batches {indices[0]}:{indices[-1] + 1}"
        offset = spans[0][1]  # slice_batches counts rows from the first batch read
        for batch in slice_batches(batches, row_start - offset, row_stop - offset, where):
            yield batch if columns is None else batch.select(list(columns))

    def close(self) -> None:
        self._open.clear()
        self._headers.clear()
