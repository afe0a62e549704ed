"""DALI's text index of a WebDataset shard (format ``v1.2``), read and written (where an
index comes from, and its cache: `loading`).

The format, as NVIDIA DALI's ``tools/wds2idx.py`` writes it and its loader
(``webdataset_loader.cc``) reads it::

    v1.2 <number of samples>\\n
    <ext> <data offset> <size> <member name>[ <ext> <offset> <size> <name>]...\\n   (one per sample)

Fields are separated by single spaces, every line ends with ``\\n`` (the last too), the
extension is the raw text after the first dot of the file name (not lower-cased), offsets are
data offsets (multiples of 512), components are in tar order. ``v1.1`` is the same without the
names. DALI's reader splits on whitespace, so names holding whitespace cannot be written.

Differences from DALI, deliberate: an empty shard has the index ``v1.2 0`` (DALI's tool refuses
to index it and its reader wants a positive count); dotfiles are skipped as DALI does, but a
member without an extension is an error (see `samples`); names are written as UTF-8 text where
DALI's tool writes what ``tar --list`` prints (the same for printable ASCII names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import CorruptFileError, InvalidArgumentError
from ..errors.keywords import renamed
from .arrays import IndexArrays, arrays_of, check_arrays, parse_arrays, samples_of
from .samples import Component, Sample, group_samples, split_name
from .tar import BLOCK, scan_tar

__all__ = ["VERSION", "ShardIndex", "build_index", "format_index", "index_path", "parse_index"]

VERSION = "v1.2"
_FIELDS = {"v1.1": 3, "v1.2": 4}  # tokens per component


class ShardIndex:
    """The samples of one shard, where each component's data lies.

    Held as `Sample` objects or as `IndexArrays` (what `parse_index` builds, and what the
    format reads from); each form is built from the other on first use.

    Args:
        samples: the samples in tar order.
        version: the index format it was read from (``"v1.1"`` indexes hold no names: keys and
            component names are empty).

    Attributes:
        version: as given.
    """

    __slots__ = ("_arrays", "_samples", "version")

    def __init__(self, samples: Sequence[Sample] = (), version: str = VERSION) -> None:
        self._samples: tuple[Sample, ...] | None = tuple(samples)
        self._arrays: IndexArrays | None = None
        self.version = version

    @classmethod
    def from_arrays(cls, arrays: IndexArrays, version: str = VERSION) -> ShardIndex:
        """An index of the samples ``arrays`` describes."""
        index = cls((), version)
        index._samples, index._arrays = None, arrays
        return index

    @property
    def samples(self) -> tuple[Sample, ...]:
        """The samples in tar order."""
        if self._samples is None:
            assert self._arrays is not None
            self._samples = samples_of(self._arrays)
        return self._samples

    def arrays(self) -> IndexArrays:
        """The samples as arrays."""
        if self._arrays is None:
            assert self._samples is not None
            self._arrays = arrays_of(self._samples)
        return self._arrays

    def __len__(self) -> int:
        return len(self._samples) if self._samples is not None else len(self.arrays().keys)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardIndex):
            return NotImplemented
        return (self.version, self.samples) == (other.version, other.samples)

    def __hash__(self) -> int:
        return hash((self.version, self.samples))

    def __repr__(self) -> str:
        return f"ShardIndex(<{len(self)} samples>, version={self.version!r})"

    def extensions(self) -> list[str]:
        """Every extension present, in first-seen order."""
        return list(self.arrays().extensions)

    def data_start(self, i: int) -> int:
        """Data offset of sample ``i``'s first component."""
        return self.samples[i].components[0].offset

    def data_end(self, i: int) -> int:
        """Offset just past sample ``i``'s last component's data."""
        return self.samples[i].components[-1].end

    def check(self, size: int, *, where: str) -> None:
        """Check the index can describe a shard of ``size`` bytes: components in tar order,
        each after a header block, none past the end.

        Args:
            size: the shard's size in bytes.
            where: names the index file in errors.

        Raises:
            CorruptFileError: names the line (1-based; line 1 is the header line).
        """
        check_arrays(self.arrays(), size, where=where)


def index_path(shard_path: str) -> str:
    """The sibling index of a shard: ``x/a.tar`` -> ``x/a.idx`` (other names get ``.idx``
    appended). DALI's tool cuts at the first dot instead (``a.001.tar`` -> ``a.idx``, the same
    file for every shard of such a set), which is not followed."""
    stem = shard_path[:-4] if shard_path.endswith(".tar") else shard_path
    return stem + ".idx"


def build_index(
    read: Callable[[int, int], bytes],
    size: int,
    *,
    where: str,
    lowercase: bool = True,
    read_bytes: int | None = None,
    window: int | None = None,
) -> ShardIndex:
    """Index a shard by a header-only scan (`scan_tar` + `group_samples`).

    Args:
        read: returns exactly ``n`` bytes at ``offset`` of the shard.
        size: the shard's size in bytes.
        where: names the shard in errors (a URL).
        lowercase: lower-case extensions.
        read_bytes: bytes read at a time (default 8 MiB).
        window: the earlier name of ``read_bytes`` (deprecated).

    Returns:
        The index.

    Raises:
        CorruptFileError: the tar is corrupt or breaks a grouping rule (names shard and offset).
    """
    read_bytes = renamed("build_index", ("read_bytes", read_bytes), ("window", window), 8 << 20)
    members = scan_tar(read, size, where=where, read_bytes=read_bytes)
    return ShardIndex(tuple(group_samples(members, where=where, lowercase=lowercase)))


def format_index(index: ShardIndex) -> str:
    """The ``v1.2`` text of an index, byte for byte what DALI's ``wds2idx.py`` writes.

    wds2idx writes ``f"v1.2 {len(samples)}\\n"``, then per sample
    ``" ".join(" ".join(map(str, (ext, offset, size, name))) for each component) + "\\n"``,
    with ``ext`` the raw text after the first dot of the file name.

    Raises:
        InvalidArgumentError: the index has no names (read from ``v1.1``), or a name holds
            whitespace (the format splits on it).
    """
    if index.version != VERSION:
        raise InvalidArgumentError(f"a {index.version} index has no member names to write")
    lines = [f"{VERSION} {len(index.samples)}\n"]
    for sample in index.samples:
        parts = []
        for c in sample.components:
            if any(ch.isspace() for ch in c.name):
                raise InvalidArgumentError(
                    f"member name {c.name!r} holds whitespace: DALI's index cannot describe it"
                )
            parts.append(f"{split_name(c.name, lowercase=False)[1]} {c.offset} {c.size} {c.name}")
        lines.append(" ".join(parts) + "\n")
    return "".join(lines)


def parse_index(text: str, *, where: str, lowercase: bool = True) -> ShardIndex:
    """Read a DALI index (``v1.2``, or ``v1.1`` without names).

    Args:
        text: the index file's text.
        where: names the index file in errors.
        lowercase: lower-case extensions.

    Returns:
        The index (`ShardIndex.check` it against the shard's size before trusting it).

    Raises:
        CorruptFileError: ``"{where}: line {n}: ..."`` for an unknown version, a sample count
            that does not match the lines, a malformed or misaligned component, a repeated
            extension, or names whose keys differ within a line.
    """
    lines = text.split("\n")
    head = lines[0].split()
    if len(head) != 2 or head[0] not in _FIELDS:
        raise CorruptFileError(
            f"{where}: line 1: expected 'v1.2 <samples>' (or v1.1), got {lines[0][:80]!r}"
        )
    version, count_text = head
    if not count_text.isdigit():
        raise CorruptFileError(f"{where}: line 1: sample count {count_text!r} is not a number")
    count = int(count_text)
    body = lines[1:]
    while body and not body[-1].strip():
        body.pop()  # the final newline (and blank lines after the samples)
    width = _FIELDS[version]
    if version == VERSION and len(body) == count:
        arrays = parse_arrays(body, lowercase=lowercase)
        if arrays is not None:
            return ShardIndex.from_arrays(arrays, version)
    # v1.1, or a line the bulk parser does not accept: line by line, to name the line.
    samples = []
    for i, line_text in enumerate(body):
        samples.append(_parse_line(line_text.split(), i + 2, width, where, lowercase))
    if len(body) != count:
        raise CorruptFileError(
            f"{where}: line {min(len(body), count) + 2}: the header line declares {count} "
            f"samples, the file has {len(body)} sample lines"
        )
    return ShardIndex(tuple(samples), version)


def _parse_line(tokens: list[str], line: int, width: int, where: str, lowercase: bool) -> Sample:
    if not tokens or len(tokens) % width:
        raise CorruptFileError(
            f"{where}: line {line}: expected groups of {width} fields "
            f"(<ext> <offset> <size>{' <name>' if width == 4 else ''}), got {len(tokens)} fields"
        )
    key: str | None = None
    components = []
    exts: set[str] = set()
    for j in range(0, len(tokens), width):
        raw_ext, offset_text, size_text = tokens[j : j + 3]
        if not (offset_text.isdigit() and size_text.isdigit()):
            raise CorruptFileError(
                f"{where}: line {line}: offset {offset_text!r} / size {size_text!r} of "
                f"{raw_ext!r} are not numbers"
            )
        offset, size = int(offset_text), int(size_text)
        if offset % BLOCK:
            raise CorruptFileError(
                f"{where}: line {line}: offset {offset} of {raw_ext!r} is not a multiple of 512"
            )
        name = tokens[j + 3] if width == 4 else ""
        if width == 4:
            stem, name_ext = split_name(name, lowercase=False)
            if name_ext != raw_ext:
                raise CorruptFileError(
                    f"{where}: line {line}: extension {raw_ext!r} does not match name {name!r}"
                )
            if key is not None and stem != key:
                raise CorruptFileError(
                    f"{where}: line {line}: names {name!r} and the previous ones have different "
                    f"keys ({stem!r} vs {key!r})"
                )
            key = stem
        ext = raw_ext.lower() if lowercase else raw_ext
        if ext in exts:
            raise CorruptFileError(f"{where}: line {line}: extension {ext!r} appears twice")
        exts.add(ext)
        components.append(Component(ext, offset, size, name))
    return Sample(key or "", tuple(components))
