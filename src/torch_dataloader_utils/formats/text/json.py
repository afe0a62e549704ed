"""JSON Lines: byte-range chunks cut at newlines (see `format`)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.json as pajson

from ...errors import CorruptFileError
from ...fs import FileSystemSpec, ListedFile
from ..opening import arrow_owned, parsing
from ..records import RecordScan, read_head
from .format import TextFormat, TextParsing, text_chunk_bytes

__all__ = ["JsonFormat"]

_JSON_BLOCK = 16 << 20  # a JSON block must hold whole lines


class JsonFormat(TextFormat):
    """JSON Lines: one JSON object per line; byte-range chunks cut at newlines (a raw newline
    cannot occur inside a JSON string, so every line feed ends a record). Blank lines are not
    records; a field missing in a line reads as null.

    Args:
        schema: the fields and their types; by default inferred once from the first
            ``infer_bytes`` of the first file with rows, and then a field not in it is an
            error (pass ``schema=``); with ``schema=``, other fields are ignored.
        chunk_bytes: bytes per chunk without ``split_bytes``/``split_rows`` (default 16 MiB).
        infer_bytes: bytes the types are inferred from.
        block_bytes: the earlier name of ``chunk_bytes``, accepted for a release with a
            `DeprecationWarning`.

    Raises:
        InvalidArgumentError: an option is out of range, or both ``chunk_bytes`` and
            ``block_bytes`` are given.
    """

    name = "json"
    kind = "JSON Lines"

    def __init__(
        self,
        *,
        schema: pa.Schema | None = None,
        chunk_bytes: int | None = None,
        infer_bytes: int = 1 << 20,
        block_bytes: int | None = None,
    ) -> None:
        super().__init__(
            schema=schema,
            chunk_bytes=text_chunk_bytes("JsonFormat", chunk_bytes, block_bytes),
            infer_bytes=infer_bytes,
            quote=None,
        )

    def _scanner(self) -> RecordScan:
        return RecordScan(quote=None, delimiter=None, blank=b" \t\r", bare_cr_ends_records=False)

    def _miscount_causes(self) -> str:
        return (
            "a line holding two JSON objects, or lines ended by a bare '\\r' (records end at "
            "'\\n'), or the file changed since planning"
        )

    def _infer(self, file: ListedFile, fs: FileSystemSpec) -> TextParsing:
        if self.given_schema is not None:
            return TextParsing(tuple(self.given_schema.names), self.given_schema, inferred=False)
        block = self.infer_bytes
        while True:  # the sample holds whole lines: grow it until one fits
            head, complete = read_head(file.path, file.size, fs, block)
            if block == self.infer_bytes:
                self._check_kind(head, complete, file, fs)
            cut = head.rfind(b"\n") + 1 if not complete else len(head)
            if cut == 0:
                block *= 4
                continue
            if not head[:cut].strip():
                return TextParsing((), pa.schema([]), inferred=True)  # no records
            with parsing(fs.url(file.path), kind="valid JSON Lines"):
                schema = pajson.read_json(
                    pa.BufferReader(arrow_owned(head[:cut])),
                    read_options=pajson.ReadOptions(use_threads=False, block_size=cut + 1),
                ).schema
            if not schema.names:  # records, but every one is {}: no column to read or count
                raise CorruptFileError(
                    f"{fs.url(file.path)}: no fields inferred from its first {cut} bytes (every "
                    "record is {}); pass format_options={'schema': pyarrow.schema([...])}"
                )
            return TextParsing(tuple(schema.names), schema, inferred=True)

    def _reader(
        self,
        source: pa.NativeFile,
        spec: TextParsing,
        columns: list[str],
        whole: bool,
        block: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        size = source.size() if isinstance(source, pa.BufferReader) else 0
        reader = pajson.open_json(
            source,
            read_options=pajson.ReadOptions(
                use_threads=False, block_size=block or max(size + 1, _JSON_BLOCK)
            ),
            parse_options=pajson.ParseOptions(
                explicit_schema=spec.schema,
                unexpected_field_behavior="error" if spec.inferred else "ignore",
            ),
        )
        for batch in reader:
            yield batch.select(columns)

    def __repr__(self) -> str:
        return "JsonFormat()"
