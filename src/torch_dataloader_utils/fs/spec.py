"""A picklable description of a filesystem, rebuilt in each process that uses it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.core import split_protocol

__all__ = ["FileSystemSpec"]

_LOCAL_PROTOCOLS = frozenset({"file", "local"})


class FileSystemSpec:
    """Protocol plus storage options: what every process needs to rebuild a filesystem.

    The spec pickles through its constructor arguments only; the fsspec and pyarrow filesystem
    objects are built lazily in each process (a fork or spawn worker builds its own). Storage
    options may hold secrets, so they never appear in ``repr``.

    Args:
        protocol: fsspec protocol (``"file"``, ``"s3"``, ``"gs"``, ...).
        storage_options: keyword arguments for the fsspec filesystem.
    """

    def __init__(self, protocol: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.protocol = "file" if protocol in _LOCAL_PROTOCOLS else protocol
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        self._fsspec: fsspec.AbstractFileSystem | None = None
        self._arrow: pafs.FileSystem | None = None

    @classmethod
    def for_path(
        cls, path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> FileSystemSpec:
        """The spec for the protocol of ``path`` (local when it has none)."""
        protocol, _ = split_protocol(os.fspath(path))
        return cls(protocol or "file", storage_options)

    @property
    def is_local(self) -> bool:
        """True for the local filesystem."""
        return self.protocol == "file"

    def fsspec(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem, built once per process."""
        if self._fsspec is None:
            self._fsspec = fsspec.filesystem(self.protocol, **self.storage_options)
        return self._fsspec

    def arrow(self) -> pafs.FileSystem:
        """A pyarrow filesystem over the same storage (native for local, fsspec-bridged else)."""
        if self._arrow is None:
            if self.is_local:
                self._arrow = pafs.LocalFileSystem()
            else:
                self._arrow = pafs.PyFileSystem(pafs.FSSpecHandler(self.fsspec()))
        return self._arrow

    def strip(self, path: str | os.PathLike[str]) -> str:
        """``path`` without its protocol, in the form both filesystems accept."""
        text = os.fspath(path)
        if self.is_local:
            _, bare = split_protocol(text)
            return os.path.abspath(os.path.expanduser(str(bare)))
        return str(self.fsspec()._strip_protocol(text))

    def url(self, path: str) -> str:
        """``path`` with its protocol, for messages and fingerprints."""
        return path if self.is_local else f"{self.protocol}://{path}"

    def __getstate__(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["protocol"], state["storage_options"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FileSystemSpec)
            and self.protocol == other.protocol
            and self.storage_options == other.storage_options
        )

    def __hash__(self) -> int:
        return hash(self.protocol)

    def __repr__(self) -> str:
        keys = ", ".join(sorted(self.storage_options))
        return f"FileSystemSpec(protocol={self.protocol!r}, storage_options=<{keys or 'none'}>)"
