"""Telling a file's format by its first and last bytes, to refuse a file read as another format
with what it looks like ("this looks like Parquet: pass format='parquet'") instead of binary
garbage or a footer error.

Checks use bytes planning reads anyway (a text file's first scan piece, a footer's tail); a
binary reader sniffs only on its error path, where one more small read costs nothing that
matters.
"""

from __future__ import annotations

from ..errors import CorruptFileError
from ..fs import FileSystemSpec, ListedFile
from .opening import read_range

__all__ = ["HEAD_BYTES", "TAIL_BYTES", "check_text", "looks_like", "refuse_other_format"]

HEAD_BYTES = 512  # a tar header's "ustar" sits at byte 257
TAIL_BYTES = 16  # Parquet's "PAR1", ORC's postscript magic and length byte, IPC's "ARROW1"
# What each kind is read with.
_FORMAT = {
    "Parquet": "parquet",
    "ORC": "orc",
    "Arrow IPC": "ipc",
    "a tar archive": "webdataset",
    "CSV/JSON text": "csv' or format='json",
}


def looks_like(head: bytes, tail: bytes) -> str | None:
    """What a file starting with ``head`` and ending with ``tail`` looks like: ``"Parquet"``,
    ``"ORC"``, ``"Arrow IPC"``, ``"a tar archive"``, ``"gzip-compressed data"``, ``"CSV/JSON
    text"``, or ``None`` (binary of no kind known here). ``tail`` may overlap ``head``."""
    if head[:4] == b"PAR1" and tail[-4:] == b"PAR1":
        return "Parquet"
    # ORC: "ORC" first, and the postscript ends with its magic then its length byte.
    if head[:3] == b"ORC" and tail[-4:-1] == b"ORC":
        return "ORC"
    if head[:6] == b"ARROW1" or head[:4] == b"\xff\xff\xff\xff":  # file, or stream
        return "Arrow IPC"
    if head[257:262] == b"ustar":
        return "a tar archive"
    if head[:2] == b"\x1f\x8b":
        return "gzip-compressed data"
    if head and _is_text(head):
        return "CSV/JSON text"
    return None


def _is_text(head: bytes) -> bool:
    """Printable UTF-8 (a cut multi-byte character at the end aside), tabs and line ends."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return False
        text = head[: exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def _advice(kind: str, expected: str) -> str:
    if kind == "gzip-compressed data":
        return f"{kind}: name the file with a .gz suffix if it is compressed {expected}"
    return f"{kind}: pass format='{_FORMAT[kind]}'"


def check_text(head: bytes, tail: bytes, url: str, expected: str) -> None:
    """Refuse a file a text format (``expected``: ``"CSV"``, ``"JSON Lines"``) was asked to read
    that is one of the binary formats.

    Raises:
        CorruptFileError: the file looks like Parquet, ORC, Arrow IPC or a tar archive.
    """
    kind = looks_like(head, tail)
    if kind in ("Parquet", "ORC", "Arrow IPC", "a tar archive"):
        raise CorruptFileError(f"{url}: not {expected}: this looks like {_advice(kind, expected)}")


def refuse_other_format(
    file: ListedFile, fs: FileSystemSpec, expected: str, error: CorruptFileError
) -> None:
    """On a binary reader's error path: raise a clearer error when ``file`` is another known
    format or text (one small read at each end); return when it is not (``error`` stands).

    Args:
        file: the file the reader failed on.
        fs: its filesystem.
        expected: what the reader reads (``"Parquet"``, ``"ORC"``, ``"Arrow IPC"``).
        error: the reader's error, chained to the clearer one.

    Raises:
        CorruptFileError: the file looks like something else, saying what to pass.
    """
    size = file.size
    if size <= 0:
        return
    try:
        head = read_range(file.path, 0, min(size, HEAD_BYTES), fs)
        tail = head[-TAIL_BYTES:]
        if size > HEAD_BYTES:
            tail = read_range(file.path, size - TAIL_BYTES, TAIL_BYTES, fs)
    except OSError:  # the storage failed: the reader's error stands
        return
    kind = looks_like(head, tail)
    if kind is None or kind == expected:
        return
    url = fs.url(file.path)
    message = f"{url}: not {expected}: this looks like {_advice(kind, expected)}"
    raise CorruptFileError(message) from error
