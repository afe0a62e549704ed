"""Deletion vectors: a data file's deleted rows as a roaring bitmap, shared by Delta Lake and
Iceberg v3.

Both formats store the deleted row positions of one data file as a 64-bit roaring bitmap in the
portable serialization (CRoaring's ``roaring64`` portable format, the "RoaringTreemap" spec: an
8-byte little-endian count of 32-bit bitmaps, then for each its 4-byte little-endian high key and
the 32-bit portable RoaringBitmap), preceded by the 4 magic bytes ``D1 D3 39 64`` (Delta writes
them as the little-endian int 1681511377). They differ only in the framing around it:

- Delta (PROTOCOL.md, "Deletion Vector Format"): inline in the log as the Z85 text of magic +
  bitmap (``storageType "i"``), or in a file (``"u"``: a UUID-named file under the table,
  ``"p"``: an absolute path) of a version byte (1) and, at each vector's offset, its 4-byte
  big-endian size, magic + bitmap, and the big-endian CRC-32 of magic + bitmap;
- Iceberg v3 (the Puffin blob ``deletion-vector-v1``): the 4-byte big-endian size of magic +
  bitmap, magic + bitmap, their big-endian CRC-32.

Everything decodes to a sorted, unique ``int64`` array of positions (`sources.table_deletes`).
pyroaring reads the bitmap (imported when a vector is decoded: the ``delta`` extra).
"""

from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptFileError, InvalidArgumentError, MissingDependencyError
from ..formats.opening import open_input
from ..fs import FileSystemSpec

__all__ = [
    "MAGIC",
    "DeltaDeletionVector",
    "bitmap_positions",
    "delta_dv_path",
    "puffin_dv_positions",
    "read_delta_dv",
    "z85_decode",
]

MAGIC = b"\xd1\xd3\x39\x64"  # Delta's 1681511377 little-endian; Iceberg's D1 D3 39 64
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_UUID_CHARS = 20  # a 16-byte UUID in Z85
_FILE_VERSION = 1  # the first byte of a Delta deletion vector file
INSTALL_HINT = "pip install pyroaring (the [delta] and [iceberg] extras install it)"


# (Z85 is not in the standard library, whose b85 is another alphabet; pyzmq, which has it, is
# too large a dependency for these lines.)
def z85_decode(text: str, size: int | None = None) -> bytes:
    """The bytes of Z85 ``text`` (ZeroMQ RFC 32; Delta's "base85"), cut to ``size`` bytes
    (Delta pads the bytes it encodes to a multiple of 4).

    Raises:
        ValueError: the text is not Z85 (a length not a multiple of 5, a character outside the
            alphabet, a group over 32 bits).
    """
    if len(text) % 5:
        raise ValueError(f"Z85 text has {len(text)} characters, not a multiple of 5")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for char in text[i : i + 5]:
            digit = _Z85_VALUE.get(char)
            if digit is None:
                raise ValueError(f"{char!r} is not a Z85 character")
            value = value * 85 + digit
        if value >= 1 << 32:
            raise ValueError(f"Z85 group {text[i : i + 5]!r} is over 32 bits")
        out += value.to_bytes(4, "big")
    return bytes(out if size is None else out[:size])


def bitmap_positions(data: bytes, where: str) -> np.ndarray:
    """The positions of a portable 64-bit roaring bitmap (without magic), sorted ``int64``.

    Raises:
        CorruptFileError: the bytes are not such a bitmap (``where`` names the vector).
        MissingDependencyError: pyroaring is not installed.
    """
    try:
        from pyroaring import BitMap64
    except ImportError as exc:
        raise MissingDependencyError(
            f"{where}: decoding deletion vectors needs pyroaring, which is not installed: "
            f"{INSTALL_HINT}"
        ) from exc
    try:
        bitmap = BitMap64.deserialize(data)
    except (ValueError, OverflowError) as exc:
        raise CorruptFileError(f"{where}: not a portable 64-bit roaring bitmap ({exc})") from exc
    positions = np.asarray(bitmap.to_array(), dtype=np.uint64)
    if len(positions) and positions[-1] >= 1 << 63:
        raise CorruptFileError(f"{where}: a deleted position {positions[-1]} is over 2^63")
    return positions.astype(np.int64)


def _magic_bitmap(data: bytes, where: str) -> np.ndarray:
    """Positions of magic + bitmap."""
    if data[:4] != MAGIC:
        raise CorruptFileError(
            f"{where}: bad deletion vector magic {data[:4].hex()} (expected {MAGIC.hex()})"
        )
    return bitmap_positions(data[4:], where)


def _framed(blob: bytes, size: int | None, where: str) -> np.ndarray:
    """Positions of size (BE) + magic + bitmap + CRC-32 (BE) of magic + bitmap."""
    if len(blob) < 8:
        raise CorruptFileError(f"{where}: a deletion vector of {len(blob)} bytes is truncated")
    framed = int.from_bytes(blob[:4], "big")
    if size is not None and framed != size:
        raise CorruptFileError(
            f"{where}: the deletion vector's size field says {framed} bytes, the table's "
            f"metadata {size}"
        )
    if len(blob) < framed + 8:
        raise CorruptFileError(f"{where}: the deletion vector ({framed} bytes) is truncated")
    data = blob[4 : 4 + framed]
    crc = int.from_bytes(blob[4 + framed : 8 + framed], "big")
    if zlib.crc32(data) != crc:
        raise CorruptFileError(
            f"{where}: the deletion vector's CRC-32 is {zlib.crc32(data):08x}, the file says "
            f"{crc:08x}: the file is corrupt"
        )
    return _magic_bitmap(data, where)


def puffin_dv_positions(blob: bytes, where: str) -> np.ndarray:
    """The deleted positions of an Iceberg v3 Puffin ``deletion-vector-v1`` blob.

    Raises:
        CorruptFileError: a bad size, magic, CRC-32 or bitmap.
    """
    return _framed(blob, len(blob) - 8, where)  # (a blob is exactly its frame)


@dataclass(frozen=True)
class DeltaDeletionVector:
    """A Delta deletion vector descriptor, as an add action holds it.

    Attributes:
        storage_type: ``"i"`` inline, ``"u"`` a UUID-named file under the table, ``"p"`` a path.
        path_or_inline: the Z85 vector (``"i"``), prefix + Z85 UUID (``"u"``) or the path.
        offset: where the vector starts in its file (its size field); ``None`` inline.
        size: bytes of magic + bitmap.
        cardinality: the deleted rows.
    """

    storage_type: str
    path_or_inline: str
    offset: int | None
    size: int
    cardinality: int


def delta_dv_path(dv: DeltaDeletionVector, root: str) -> str:
    """The file of an on-disk vector: ``root/<prefix>/deletion_vector_<uuid>.bin`` (``"u"``), or
    its own path (``"p"``), as the table's storage names it.

    Raises:
        InvalidArgumentError: an inline vector, or an unknown storage type.
        CorruptFileError: a ``"u"`` descriptor whose UUID is not Z85.
    """
    if dv.storage_type == "p":
        return dv.path_or_inline
    if dv.storage_type != "u":
        raise InvalidArgumentError(
            f"deletion vector storage type {dv.storage_type!r} has no file (known: i, u, p)"
        )
    text = dv.path_or_inline
    prefix, encoded = text[:-_UUID_CHARS], text[-_UUID_CHARS:]
    try:
        name = uuid.UUID(bytes=z85_decode(encoded))
    except ValueError as exc:
        raise CorruptFileError(f"deletion vector {text!r} of {root}: bad UUID ({exc})") from exc
    folder = f"{root.rstrip('/')}/{prefix}" if prefix else root.rstrip("/")
    return f"{folder}/deletion_vector_{name}.bin"


def read_delta_dv(
    dv: DeltaDeletionVector, root: str, fs: FileSystemSpec, *, data_file: str
) -> np.ndarray:
    """The deleted positions of a Delta data file's vector: decoded inline, or read from its
    file (``root``: the table's location without protocol, on ``fs``).

    Raises:
        CorruptFileError: a bad version byte, size, magic, CRC-32 or bitmap, or a cardinality
            other than the log's (the message names the vector's file and the data file).
        StorageNotFoundError: the vector's file is missing.
    """
    if dv.storage_type == "i":
        where = f"inline deletion vector of {data_file}"
        try:
            data = z85_decode(dv.path_or_inline, dv.size)
        except ValueError as exc:
            raise CorruptFileError(f"{where}: not Z85 ({exc})") from exc
        positions = _magic_bitmap(data, where)
    else:
        path = fs.strip(delta_dv_path(dv, root))
        where = f"deletion vector file {fs.url(path)} (of {data_file})"
        offset = 1 if dv.offset is None else int(dv.offset)
        with open_input(path, fs) as source:
            head = source.read(1)
            source.seek(offset)
            blob = source.read(dv.size + 8)
        if head != bytes([_FILE_VERSION]):
            raise CorruptFileError(f"{where}: unknown format version byte {head.hex() or 'none'}")
        positions = _framed(blob, dv.size, where)
    if len(positions) != dv.cardinality:
        raise CorruptFileError(
            f"{where}: {len(positions)} deleted rows, the log says {dv.cardinality}"
        )
    return positions
