"""A shard index as arrays: what the format reads from, built straight from DALI's text.

`parse_index` spends most of its time on Python objects: a `Sample` and a `Component` per
member. `IndexArrays` keeps the same facts in a few lists and numpy arrays, parsed in bulk
(several times faster: docs/adr/0020-measurements-behind-constants.md#webdataset-indexes),
and `ShardIndex` builds its samples from them only when asked. The bulk parser is strict:
anything it does not accept is parsed again line by line, which gives the same result or the
error naming the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from ..errors import CorruptFileError
from .samples import Component, Sample
from .tar import BLOCK

__all__ = ["IndexArrays", "arrays_of", "check_arrays", "parse_arrays", "samples_of"]

_WIDTH = 4  # fields per component in a v1.2 line: <ext> <offset> <size> <name>


@dataclass(frozen=True, eq=False)
class IndexArrays:
    """The samples of a shard, columnar.

    Attributes:
        keys: each sample's key.
        counts: components per sample (int64).
        extensions: the distinct extensions (lower-cased unless told otherwise), first-seen.
        ext: per component, its extension's position in ``extensions`` (int64).
        offsets: per component, its data offset (int64).
        sizes: per component, its data bytes (int64).
        names: per component, its member name (``""`` in a v1.1 index).
    """

    keys: list[str]
    counts: np.ndarray
    extensions: list[str]
    ext: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    names: list[str]

    def sample_of(self) -> np.ndarray:
        """Per component, the position of its sample."""
        return np.repeat(np.arange(len(self.keys)), self.counts)


def parse_arrays(lines: Sequence[str], *, lowercase: bool) -> IndexArrays | None:
    """The sample lines of a ``v1.2`` index, parsed in bulk; None where any line is not
    plainly valid (then `parse_index` parses line by line, to name the line).

    Accepts only what the line parser accepts: groups of 4 fields, offsets and sizes of ASCII
    digits (offsets multiples of 512), each name ``KEY.EXT`` with EXT its field and KEY the
    same for the whole line and free of dots in its last path component, no extension twice
    in a line (after lower-casing).
    """
    split = [line.split() for line in lines]
    fields = np.fromiter(map(len, split), np.int64, len(split))
    if len(fields) and (fields.min() == 0 or (fields % _WIDTH).any()):
        return None
    flat = list(chain.from_iterable(split))
    raw, offset_text, size_text, names = (flat[i::_WIDTH] for i in range(_WIDTH))
    digits = "".join(offset_text) + "".join(size_text)
    if not (digits.isascii() and digits.isdigit()):
        return None  # (str.isdigit alone also takes digits int() refuses, like '²')
    try:
        offsets = np.array(list(map(int, offset_text)), np.int64)
        sizes = np.array(list(map(int, size_text)), np.int64)
    except OverflowError:
        return None
    if (offsets % BLOCK).any():
        return None
    counts = fields // _WIDTH
    firsts = np.cumsum(counts) - counts
    keys = [n[: n.find(".", n.rfind("/") + 1)] for n in (names[i] for i in firsts.tolist())]
    # Every name is the line's key, a dot and its ext field: with the key cut at the first dot
    # of the first name's last path component and no "/" in the ext, that is what split_name
    # gives for each name.
    repeated = np.repeat(np.array(keys, dtype=object), counts).tolist()
    if [k + "." + e for k, e in zip(repeated, raw, strict=True)] != names:
        return None
    distinct = dict.fromkeys(raw)
    if any("/" in e for e in distinct):
        return None
    extensions: dict[str, int] = {}
    code = {
        e: extensions.setdefault(e.lower() if lowercase else e, len(extensions)) for e in distinct
    }
    ext = np.fromiter(map(code.__getitem__, raw), np.int64, len(raw))
    pairs = np.repeat(np.arange(len(keys)), counts) * max(1, len(extensions)) + ext
    if len(np.unique(pairs)) != len(pairs):
        return None  # an extension twice in one sample
    return IndexArrays(keys, counts, list(extensions), ext, offsets, sizes, names)


def arrays_of(samples: Sequence[Sample]) -> IndexArrays:
    """The arrays of ``samples`` (an index built by scanning, or written)."""
    components = [c for s in samples for c in s.components]
    extensions: dict[str, int] = {}
    ext = [extensions.setdefault(c.ext, len(extensions)) for c in components]
    return IndexArrays(
        keys=[s.key for s in samples],
        counts=np.array([len(s.components) for s in samples], np.int64),
        extensions=list(extensions),
        ext=np.array(ext, np.int64),
        offsets=np.array([c.offset for c in components], np.int64),
        sizes=np.array([c.size for c in components], np.int64),
        names=[c.name for c in components],
    )


def samples_of(arrays: IndexArrays) -> tuple[Sample, ...]:
    """The samples the arrays describe."""
    exts = [arrays.extensions[i] for i in arrays.ext.tolist()]
    components = list(
        map(Component, exts, arrays.offsets.tolist(), arrays.sizes.tolist(), arrays.names)
    )
    samples = []
    first = 0
    for key, count in zip(arrays.keys, arrays.counts.tolist(), strict=True):
        samples.append(Sample(key, tuple(components[first : first + count])))
        first += count
    return tuple(samples)


def check_arrays(a: IndexArrays, size: int, *, where: str) -> None:
    """`ShardIndex.check`: components in tar order, each after a header block, none past the
    end of a shard of ``size`` bytes (errors name ``where`` and the line)."""
    ends = a.offsets + a.sizes
    previous = np.concatenate([[0], ends[:-1]])
    overlaps = a.offsets < (previous + BLOCK - 1) // BLOCK * BLOCK + BLOCK
    bad = np.flatnonzero(overlaps | (ends > size))
    if not len(bad):
        return
    k = int(bad[0])
    line = int(np.searchsorted(np.cumsum(a.counts), k, side="right")) + 2
    ext, offset = a.extensions[int(a.ext[k])], int(a.offsets[k])
    if overlaps[k]:
        raise CorruptFileError(
            f"{where}: line {line}: offset {offset} of {ext!r} overlaps the previous "
            "component or its header (components must be in tar order)"
        )
    raise CorruptFileError(
        f"{where}: line {line}: {ext!r} at offset {offset} with {int(a.sizes[k])} bytes "
        f"runs past the end of the shard ({size} bytes): the index does not belong to this "
        "shard"
    )
