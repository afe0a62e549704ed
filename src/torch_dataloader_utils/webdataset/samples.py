"""webdataset's grouping rules: consecutive tar members sharing a key form one sample.

The rules follow webdataset 1.0.2 (`tariterators.base_plus_ext`, `group_by_keys`,
`tar_file_iterator`):

- only regular files carry data; directories are skipped;
- key = the full path up to the FIRST dot of the file name (the last path component),
  extension = the rest; keys keep their case, extensions are lower-cased unless told otherwise;
- only CONSECUTIVE members group: the same key appearing again later starts a new sample, as in
  webdataset (a `TorchDataloaderUtilsWarning` once per shard, since it usually means a badly
  written shard);
- a repeated extension within one sample is an error;
- webdataset's metadata members (a first path component like ``__name__``) are skipped.

Deliberate differences, each chosen so that no data is lost without an error:

- a file name starting with a dot (``dir/.hidden.txt``) is skipped, as DALI does; webdataset
  would make it a sample with the odd key ``dir/`` and extension ``hidden.txt``;
- a file name with no extension (no dot, or nothing after the dot) raises `CorruptFileError`:
  webdataset silently drops the member, and DALI's index tool writes a garbled entry;
- symlinks, hardlinks and other non-regular members raise `CorruptFileError`: webdataset skips
  them silently, and a link in a shard usually means it was written by a tool that did not
  store the file.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..errors import CorruptFileError, TorchDataloaderUtilsWarning
from .tar import TarMember

__all__ = ["Component", "Sample", "group_samples", "split_name"]

# webdataset's `tar_file_iterator` skips these metadata members (its `skip_meta` default, and
# top-level names like ``__meta__``).
_META = re.compile(r"__[^/]*__($|/)")


@dataclass(frozen=True, slots=True)
class Component:
    """One member of a sample.

    Attributes:
        ext: extension (lower-cased unless ``lowercase=False``).
        offset: data offset in the shard (a multiple of 512).
        size: data bytes.
        name: member name in the tar.
    """

    ext: str
    offset: int
    size: int
    name: str

    @property
    def end(self) -> int:
        """Offset just past the component's data."""
        return self.offset + self.size


@dataclass(frozen=True, slots=True)
class Sample:
    """Consecutive members sharing a key.

    Attributes:
        key: path up to the first dot of the file name (webdataset's ``__key__``).
        components: the members, in tar order.
    """

    key: str
    components: tuple[Component, ...]

    @property
    def start(self) -> int:
        """Data offset of the first component."""
        return self.components[0].offset

    @property
    def end(self) -> int:
        """Offset just past the last component's data."""
        return self.components[-1].end

    def get(self, ext: str) -> Component | None:
        """The component with extension ``ext``, or None."""
        for component in self.components:
            if component.ext == ext:
                return component
        return None


def split_name(name: str, *, lowercase: bool = True) -> tuple[str, str]:
    """Split a member name into (key, extension) at the first dot of the file name.

    ``"a/b.c/d.seg.JPG"`` -> ``("a/b.c/d", "seg.jpg")``. A name without a dot in its last
    component gives ``(name, "")``.

    Args:
        name: member name.
        lowercase: lower-case the extension (webdataset's default).

    Returns:
        The key and the extension.
    """
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    ext = name[dot + 1 :]
    return name[:dot], ext.lower() if lowercase else ext


def is_skipped(name: str) -> bool:
    """Whether a regular file is left out of samples by rule: dotfiles (as DALI does) and
    webdataset's ``__metadata__`` members."""
    base = name[name.rfind("/") + 1 :]
    return (
        base.startswith(".")
        or _META.match(name) is not None
        or ("/" not in name and name.startswith("__") and name.endswith("__"))
    )


def group_samples(
    members: Iterable[TarMember], *, where: str, lowercase: bool = True
) -> Iterator[Sample]:
    """Group a shard's members into samples by webdataset's rules (see the module docstring).

    Args:
        members: the shard's members in tar order (`scan_tar`).
        where: names the shard in errors (a URL).
        lowercase: lower-case extensions.

    Yields:
        The samples in tar order.

    Raises:
        CorruptFileError: a non-regular member other than a directory, a file name without an
            extension, or an extension repeated within one sample (names shard, offset, key).
    """
    key: str | None = None
    components: list[Component] = []
    exts: set[str] = set()
    seen: set[str] = set()
    warned = False
    for member in members:
        if member.kind != "file":
            if member.kind == "dir":
                continue
            raise CorruptFileError(
                f"{where}: offset {member.header_offset}: member {member.name!r} is a "
                f"{member.kind}, not a regular file; WebDataset shards hold regular files only"
            )
        name = member.name
        slash = name.rfind("/")
        if name[slash + 1 : slash + 2] == "." or (name[:2] == "__" and is_skipped(name)):
            continue  # a dotfile, or webdataset's metadata
        dot = name.find(".", slash + 1)
        stem, ext = (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])
        if lowercase:
            ext = ext.lower()
        if not ext:
            raise CorruptFileError(
                f"{where}: offset {member.header_offset}: member {name!r} has no extension "
                "(webdataset would drop it silently); every member must be KEY.EXTENSION"
            )
        if stem != key:
            if key is not None:
                yield Sample(key, tuple(components))
                seen.add(key)
                if stem in seen and not warned:
                    warned = True
                    warnings.warn(  # the shard's writer should fix it: never only a log line
                        f"{where}: offset {member.header_offset}: key {stem!r} appears again "
                        "after other samples; it makes a second sample, as in webdataset "
                        "(members of one sample should be consecutive)",
                        TorchDataloaderUtilsWarning,
                        stacklevel=2,
                    )
            key, components, exts = stem, [], set()
        if ext in exts:
            raise CorruptFileError(
                f"{where}: offset {member.header_offset}: sample {key!r} has extension {ext!r} "
                f"twice (member {name!r})"
            )
        exts.add(ext)
        components.append(Component(ext, member.offset, member.size, name))
    if key is not None:
        yield Sample(key, tuple(components))
