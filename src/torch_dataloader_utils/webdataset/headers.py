"""The read-time check that a shard still has the layout its index describes.

Before slicing components out of the bytes of a range request, the tar header block just
before each component (its member's own header: PAX and GNU extension headers come before it)
is checked, in bulk:

- its checksum must be valid (unsigned or signed sum, as `tar.py` accepts): a V7 tar has no
  ``ustar`` magic, so the magic cannot be the test;
- its name must be the member name the index holds, where that can be compared cheaply: the
  index's name is ASCII and at most 100 bytes (the header's name field, or ``prefix/name`` of
  a ustar header). A longer or non-ASCII name comes through a PAX or GNU long-name header
  before this one, which the request did not read: such names are not compared.

A stale index of a rewritten shard (a sibling ``.idx`` kept while the shard was rebuilt with
the same size) then fails with an error rather than attaching values to the wrong key.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..errors import CorruptFileError
from .slicing import ShardTable
from .tar import BLOCK

__all__ = ["HEADER", "check_headers", "check_span", "misplaced"]

HEADER = BLOCK  # a tar header block, before each member's data
_NAME = 100  # the name field, at offset 0
_SUM_AT = 148  # the checksum field, 8 bytes
_GNU_MAGIC = b"ustar  \0"


def check_span(shard: ShardTable, base: int, end: int) -> None:
    """Check a request's bytes ``[base, end)`` (from `slicing.requests`) lie in the shard.

    Raises:
        CorruptFileError: they do not: the index is not this shard's (names the shard).
    """
    if base < 0:
        raise CorruptFileError(
            f"{shard.url}: its index puts data at offset {base + HEADER}, before any tar "
            "header could fit: the index is not this shard's"
        )
    if end > shard.size:
        raise CorruptFileError(
            f"{shard.url}: bytes {base}-{end} are past the end of the shard ({shard.size} "
            "bytes): it is shorter than its index says"
        )


def check_headers(
    shard: ShardTable,
    buffer: bytes,
    base: int,
    *,
    rows: np.ndarray,
    spans: Sequence[tuple[np.ndarray, np.ndarray]],
    alternatives: Sequence[tuple[str, ...]],
) -> None:
    """Check the header before each component read is the one the index describes
    (`misplaced`).

    Args:
        shard: the shard.
        buffer: its bytes from offset ``base``.
        base: as said.
        rows: the samples read.
        spans: per selected column, the offsets and sizes of their components.
        alternatives: per selected column, its extensions (`ShardTable.pick`).

    Raises:
        CorruptFileError: names the shard, the sample, its key, the member and its offset.
    """
    names = [shard.member_names(a, rows) for a in alternatives]
    bad = misplaced(buffer, base, spans, names)
    if bad is not None:
        i, offset = int(rows[bad[1]]), int(spans[bad[0]][0][bad[1]])
        raise CorruptFileError(
            f"{shard.url}: sample {i} (key {shard.keys[i].as_py()!r}): its index puts member "
            f"{names[bad[0]][bad[1]].as_py()!r} at offset {offset}, but {bad[2]}; the shard "
            "changed since its index was made (delete the stale .idx, or rebuild it with "
            "`tdu index`)"
        )


def misplaced(
    buffer: bytes,
    base: int,
    spans: Sequence[tuple[np.ndarray, np.ndarray]],
    names: Sequence[pa.StringArray],
) -> tuple[int, int, str] | None:
    """The first component whose header is not the one its index describes.

    Args:
        buffer: file bytes from offset ``base``, holding every component's header block.
        base: the file offset of ``buffer[0]``.
        spans: per selected column, the components' offsets (-1: absent) and sizes.
        names: per selected column, the member names the index holds (one per row).

    Returns:
        ``(column, row, what is wrong)``, or None when every header is in place.
    """
    data = np.frombuffer(buffer, np.uint8)
    # Data offsets are multiples of 512 (the index is checked) and so is base: every header
    # is a whole row of the buffer seen as blocks.
    whole = data[: len(data) // HEADER * HEADER].reshape(-1, HEADER)
    for j, ((off, _), expected) in enumerate(zip(spans, names, strict=True)):
        present = np.flatnonzero(off >= 0)
        if not len(present):
            continue
        blocks = whole[(off[present] - base) // HEADER - 1]
        valid = _checksum_valid(blocks)
        if not valid.all():
            return j, int(present[np.flatnonzero(~valid)[0]]), "no tar header before it"
        wanted = expected.take(pa.array(present))
        for k in np.flatnonzero(~_names_match(blocks, wanted)).tolist():
            got = _header_name(blocks[k].tobytes())
            if got != wanted[k].as_py().encode("utf-8", "surrogateescape"):
                found = got.decode("utf-8", "replace")
                return j, int(present[k]), f"the tar header before it names {found!r}"
    return None


def _checksum_valid(blocks: np.ndarray) -> np.ndarray:
    """Per header block, whether its stored checksum matches its bytes."""
    field = blocks[:, _SUM_AT : _SUM_AT + 8]
    blank = 8 * 32  # the checksum is computed with its own field as spaces
    unsigned = _byte_sums(blocks) - field.sum(axis=1, dtype=np.int64) + blank
    # Octal digits after optional leading spaces, up to the first other byte.
    digit = (field >= ord("0")) & (field <= ord("7"))
    lead = np.cumprod(field == ord(" "), axis=1).astype(bool)
    inside = np.cumprod(digit | lead, axis=1).astype(bool) & digit
    after: np.ndarray = np.cumsum(inside[:, ::-1], axis=1)[:, ::-1] - inside  # digits after it
    stored = np.where(inside, (field.astype(np.int64) - ord("0")) << (3 * after), 0).sum(axis=1)
    valid: np.ndarray = inside.any(axis=1) & (stored == unsigned)
    if not valid.all():  # old Sun tars summed signed bytes (differing where a byte >= 128)
        other = np.flatnonzero(~valid)
        high = (blocks[other] >= 0x80).sum(axis=1) - (field[other] >= 0x80).sum(axis=1)
        valid[other] = inside[other].any(axis=1) & (stored[other] == unsigned[other] - 256 * high)
    return valid


def _byte_sums(blocks: np.ndarray) -> np.ndarray:
    """Per 512-byte row, the sum of its bytes: as 64 words of four 16-bit lanes, each lane
    summing 128 bytes (at most 32640: no carry between lanes), several times faster than a
    byte-wise reduction."""
    words = blocks.view("<u8")
    mask = np.uint64(0x00FF00FF00FF00FF)
    lanes = ((words & mask) + ((words >> np.uint64(8)) & mask)).sum(axis=1, dtype=np.uint64)
    low = np.uint64(0xFFFF)
    total = (
        (lanes & low)
        + ((lanes >> np.uint64(16)) & low)
        + ((lanes >> np.uint64(32)) & low)
        + (lanes >> np.uint64(48))
    )
    sums: np.ndarray = total.astype(np.int64)
    return sums


def _names_match(blocks: np.ndarray, wanted: pa.StringArray) -> np.ndarray:
    """Per header, whether its name field is ``wanted`` or the name cannot be compared
    cheaply (longer than the field, or not ASCII); False also where a ustar ``prefix`` is to
    be applied (checked one by one). Compares the names' bytes only, not whole fields."""
    n = len(wanted)
    offsets = np.frombuffer(wanted.buffers()[1], np.int32)[wanted.offset : wanted.offset + n + 1]
    chars = wanted.buffers()[2]
    text = np.frombuffer(chars, np.uint8) if chars is not None else np.zeros(0, np.uint8)
    text = text[offsets[0] : offsets[-1]]
    lengths = np.diff(offsets).astype(np.int64)
    rows = np.repeat(np.arange(n), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    position = np.arange(len(text)) - np.repeat(starts, lengths)
    near = position < _NAME  # (longer names are not compared: their heads stay in the block)
    rows, text = rows[near], text[near]
    found = blocks.reshape(-1)[rows * HEADER + position[near]]
    differ = np.bincount(rows, weights=found != text, minlength=n) > 0
    wide = np.bincount(rows, weights=text >= 0x80, minlength=n) > 0
    comparable = (lengths > 0) & (lengths <= _NAME) & ~wide
    ended = blocks[np.arange(n), np.minimum(lengths, _NAME - 1)] == 0  # the NUL after it
    match: np.ndarray = ~comparable | (~differ & ((lengths == _NAME) | ended))
    return match


def _header_name(block: bytes) -> bytes:
    """The name a ustar header gives (its ``prefix`` applied), as `tar.py` reads it."""
    name = block[:_NAME].split(b"\0", 1)[0]
    if block[345] and block[257:265] != _GNU_MAGIC:
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    return name
