"""A picklable description of a filesystem, rebuilt in each process that uses it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
from fsspec import AbstractFileSystem
from fsspec.core import split_protocol

from ..errors import InvalidArgumentError
from .clients import Clients
from .errors import missing_filesystem
from .forks import ProcessLocal
from .hub import open_hub, read_hub_range
from .native import NATIVE_PROTOCOLS, native_filesystem, untranslatable
from .options import StorageOptions, merge_options
from .ranges import RangeFile
from .reported import native_info
from .retry import RetryCounter, RetryPolicy, is_refused, retrying
from .s3_timestamps import quick_timestamps

__all__ = ["STORAGE_BACKENDS", "FileSystemSpec", "StorageBackend", "StorageOptions"]

T = TypeVar("T")

_LOCAL_PROTOCOLS = frozenset({"file", "local"})

StorageBackend = Literal["auto", "arrow", "fsspec"]
STORAGE_BACKENDS: tuple[str, ...] = ("auto", "arrow", "fsspec")

# Open native files kept per process for range reads (a native open costs a HEAD request): more
# than planning's threads (`fs.threads.PLAN_THREADS`), each of which opens one before it reads.
_OPEN_FILES = 64

# The Azure C++ SDK keeps its connection pool in a process-wide global, which a fork copies:
# forked workers received each other's responses (docs/adr/0006-object-storage-reads.md).
# So "auto" reads Azure through adlfs, and "arrow" refuses to build one in a forked child of a
# process that already had one: built in a process that built one, inherited in its children.
_native_azure: ProcessLocal[bool] = ProcessLocal(lambda: True)


class FileSystemSpec:
    """Protocol plus storage options: what every process needs to rebuild a filesystem.

    The spec pickles through its constructor arguments only; the fsspec and pyarrow filesystem
    objects are built lazily in each process (a fork or spawn worker builds its own). Storage
    options may hold secrets, so they never appear in ``repr``; a callable is pickled as is
    and called in each process.

    Args:
        protocol: fsspec protocol (``"file"``, ``"s3"``, ``"gs"``, ...).
        storage_options: keyword arguments for the fsspec filesystem, or a picklable function
            returning them (for credentials that expire).
        backend: ``"arrow"``: pyarrow's native S3/GCS/Azure filesystem (parallel range reads),
            built from the same options; ``"fsspec"``: fsspec file objects; ``"auto"``
            (default): native where the protocol has one and every option translates.
        retry: how requests are retried.
    """

    def __init__(
        self,
        protocol: str,
        storage_options: StorageOptions | None = None,
        *,
        backend: StorageBackend = "auto",
        retry: RetryPolicy | None = None,
        retries: RetryCounter | None = None,
    ) -> None:
        if backend not in STORAGE_BACKENDS:
            raise InvalidArgumentError(
                f"storage_backend must be one of {STORAGE_BACKENDS}, got {backend!r}"
            )
        if storage_options is not None and not (
            callable(storage_options) or isinstance(storage_options, Mapping)
        ):
            raise InvalidArgumentError(
                "storage_options must be a mapping or a function returning one, got "
                f"{type(storage_options).__name__}"
            )
        self.protocol = "file" if protocol in _LOCAL_PROTOCOLS else protocol
        self._source: StorageOptions = (
            storage_options if callable(storage_options) else dict(storage_options or {})
        )
        self.backend: StorageBackend = backend
        self.retry = retry or RetryPolicy()
        self.retries = retries or RetryCounter()
        self._local: ProcessLocal[Clients] = ProcessLocal(Clients)
        self._generation = 0  # refreshes so far

    @classmethod
    def for_path(
        cls,
        path: str | os.PathLike[str],
        storage_options: StorageOptions | None = None,
        *,
        backend: StorageBackend = "auto",
        retry: RetryPolicy | None = None,
    ) -> FileSystemSpec:
        """The spec for the protocol of ``path`` (local when it has none)."""
        protocol, _ = split_protocol(os.fspath(path))
        return cls(protocol or "file", storage_options, backend=backend, retry=retry)

    def under(self, own: FileSystemSpec) -> FileSystemSpec:
        """This storage as ``own`` reads storage: this protocol, ``own``'s storage options over
        this spec's (key by key, nested mappings too; `fs.options.merge_options`), ``own``'s
        backend, retry policy and retry counter. An options function of either is called in
        each process that reads, as ever."""
        return FileSystemSpec(
            self.protocol,
            merge_options(self._source, own._source),
            backend=own.backend,
            retry=own.retry,
            retries=own.retries,
        )

    @property
    def is_local(self) -> bool:
        """True for the local filesystem."""
        return self.protocol == "file"

    @property
    def storage_options(self) -> dict[str, Any]:
        """The options (a callable is called once per process, and again on `refresh`)."""
        clients = self._local.get()
        found = clients.options
        if found is not None:
            return found
        with clients.options_lock:  # fetch threads share one call of the options function
            if clients.options is None:
                source = self._source
                options = source() if callable(source) else source
                if not isinstance(options, Mapping):
                    raise InvalidArgumentError(
                        "the storage_options function must return a mapping, got "
                        f"{type(options).__name__}"
                    )
                clients.options = dict(options)
            return clients.options

    @property
    def refreshable(self) -> bool:
        """Whether the options come from a function (credentials can be fetched again)."""
        return callable(self._source)

    def refresh(self) -> None:
        """Forget the options and filesystems: the next use calls the options function again."""
        clients = self._local.get()
        with clients.lock, clients.build_lock, clients.options_lock:
            self._generation += 1
            clients.options = None
            clients.fsspec = None
            clients.arrow = None
            clients.files.clear()

    @property
    def native(self) -> bool:
        """Whether reads go through a pyarrow native filesystem (local disk included)."""
        if self.is_local or self.backend == "arrow":
            return True
        if self.backend == "fsspec" or self.protocol not in NATIVE_PROTOCOLS:
            return False
        if NATIVE_PROTOCOLS[self.protocol] == "azure":
            return False  # not fork-safe (see _native_azure): opt in with "arrow"
        return not untranslatable(self.protocol, self.storage_options)

    def fsspec(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem, built once per process."""
        clients = self._local.get()
        found = clients.fsspec
        if found is None:
            with clients.build_lock:
                if clients.fsspec is None:  # (fsspec.filesystem's steps; an import error told)
                    clients.fsspec = quick_timestamps(self.fsspec_class()(**self.storage_options))
                found = clients.fsspec
        return found

    def arrow(self) -> pafs.FileSystem:
        """A pyarrow filesystem over the same storage: native (local, or S3/GCS/Azure as
        `native` says), else fsspec bridged into pyarrow."""
        clients = self._local.get()
        found = clients.arrow
        if found is None:
            with clients.build_lock:
                if clients.arrow is None:
                    clients.arrow = self._build_arrow()
                found = clients.arrow
        return found

    def _build_arrow(self) -> pafs.FileSystem:
        if self.is_local:
            return pafs.LocalFileSystem()
        if self.native:
            if NATIVE_PROTOCOLS.get(self.protocol) == "azure":
                _claim_native_azure()
            return native_filesystem(
                self.protocol, self.storage_options, timeout=self.retry.request_timeout
            )
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fsspec()))

    def request(self, call: Callable[[], T], *, what: str) -> T:
        """``call()`` (one storage request), retried as `retry` says. When the options come
        from a function and the storage refuses them (403, expired token), the function is
        called again, once for all threads refused with the same options, and the request
        tried again.

        Raises:
            StorageError: a transient failure persisted (names ``what``).
            Exception: a permanent failure, unchanged.
        """
        generation = self._generation
        try:
            return retrying(call, what=what, policy=self.retry, counter=self.retries)
        except OSError as exc:
            if not (self.refreshable and is_refused(exc)):
                raise
            with self._local.get().refresh_lock:
                if self._generation == generation:
                    self.refresh()
            return retrying(call, what=what, policy=self.retry, counter=self.retries)

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` of ``path`` in one `request`.

        Safe to call from several threads at once.
        """
        what = f"{self.url(path)} bytes {offset}-{offset + size - 1}"

        def once() -> bytes:
            if self.protocol == "hf":  # (at a commit: one ranged GET, `fs.hub`)
                return read_hub_range(self, path, offset, size)
            if self.native:
                handle = self._native_file(path)
                if handle is not None:
                    return bytes(handle.read_at(size, offset))
            data = self.fsspec().cat_file(path, start=offset, end=offset + size)
            return bytes(data)

        data = self.request(once, what=what)
        if len(data) != size:
            raise OSError(f"{what}: got {len(data)} bytes, the object is shorter than expected")
        return data

    def open_input(self, path: str) -> pa.NativeFile:
        """``path`` opened for random access. On an object store (S3, GCS, Azure) opening asks
        nothing when this process knows the size (a listing's, or a `head`'s), else makes that
        one request; reads are retried range reads (`read_range`), ahead in blocks through
        fsspec as its files read. On the Hugging Face Hub, ranged GETs at the plan's commit
        (`fs.hub.open_hub`). Elsewhere: the filesystem's own open."""
        if self.protocol == "hf":
            return open_hub(self, path, self._local.get().reported.size(path))
        if self.is_local or self.protocol not in NATIVE_PROTOCOLS:
            return self.arrow().open_input_file(path)
        size = self._local.get().reported.size(path)
        if size is None:
            size = int(self.head(path).get("size") or 0)
        fetch = functools.partial(self.read_range, path)
        return RangeFile(size, {}, fetch, ahead=0 if self.native else self._block()).arrow()

    def _block(self) -> int:
        """How far fsspec's files read ahead: their filesystem's block (s3fs's and gcsfs's
        ``default_block_size``, 50 and 5 MiB; adlfs's ``blocksize``, 50 MiB)."""
        fsys = self.fsspec()
        return int(getattr(fsys, "default_block_size", None) or fsys.blocksize)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        """``path`` opened to read through once, undecompressed."""
        return self.arrow().open_input_stream(path, compression=None)

    def listed(self, sizes: Iterable[tuple[str, int]]) -> None:
        """Sizes a listing just gave, ``(path, size)``: opening and reading those files in this
        process asks the store nothing more (no metadata request)."""
        self._local.get().reported.listed(sizes)

    def head(self, path: str, *, since: float | None = None) -> Mapping[str, Any]:
        """What the store reports of ``path``: its ``size`` and version fields, as fsspec's
        ``info`` names them (a native open's metadata: ``ETag``, ``generation``, ...).

        One metadata request (retried), unless this process made one at or after ``since``
        (a `time.monotonic` reading): that one's answer. Natively the request is an open,
        whose handle the range reads that follow use: one request serves both.

        Raises:
            OSError: the request failed (not found, refused, ...).
        """
        reported = self._local.get().reported
        if since is not None:
            found = reported.since(path, since)
            if found is not None:
                return found
        if self.native and not self.is_local:
            handle = self.request(lambda: self._open_native(path), what=self.url(path))
            return native_info(handle)
        return self.info(path)

    def info(self, path: str) -> Mapping[str, Any]:
        """fsspec's ``info`` of ``path`` asked of the store now (one request, retried), never
        a listing's cached answer."""

        def ask() -> Mapping[str, Any]:
            self.fsspec().invalidate_cache(path)  # (a listing's cache: what the store said then)
            return self.fsspec().info(path)  # type: ignore[no-any-return]

        info = self.request(ask, what=self.url(path))
        self._local.get().reported.record(path, info)
        return info

    def file_size(self, path: str) -> int:
        """``path``'s size as the store reports it now (one request, retried)."""
        info = self.request(lambda: self.arrow().get_file_info(path), what=self.url(path))
        return int(info.size or 0)

    def pinned_version(self, path: str) -> str | None:
        """The version token the plan pinned for ``path``, when this filesystem knows it
        without a request (a cached read's does); None otherwise."""
        del path
        return None

    def metadata_dir(self, name: str, given: str | None) -> str | None:
        """Where metadata ``name`` (tar indexes) is cached: ``given`` (the user's choice), else
        under a node-local cache's directory when reads are cached, else None (the kind's
        default)."""
        del name
        return given

    @property
    def checks_identity(self) -> bool:
        """Whether reads check each file's pinned identity themselves: False here."""
        return False

    def native_reads(self) -> pafs.FileSystem | None:
        """pyarrow's filesystem for its own readers (a remote store read natively) or None."""
        remote = not self.is_local and self.protocol in NATIVE_PROTOCOLS
        return self.arrow() if remote and self.native else None

    def _native_file(self, path: str) -> pa.NativeFile | None:
        """This process's native handle of ``path``: kept, or opened now (a HEAD); None when
        none is kept and the size is known (a listing's, an open's): a GET through fsspec."""
        clients = self._local.get()
        with clients.lock:
            handle = clients.files.get(path)
            if handle is not None:
                clients.files.move_to_end(path)
                return handle
        if clients.reported.size(path) is not None:
            return None
        return self._open_native(path)

    def _open_native(self, path: str) -> pa.NativeFile:
        """``path`` opened natively now, its answer recorded and its handle kept for reads."""
        clients = self._local.get()
        # (pyarrow's Python open_input_file takes a path only, never a known size, so a native
        # open costs a HEAD request: its answer serves the identity check too.)
        handle = self.arrow().open_input_file(path)
        clients.reported.record(path, native_info(handle))
        with clients.lock:
            clients.files[path] = handle
            while len(clients.files) > _OPEN_FILES:
                # Not closed here: with more than _OPEN_FILES files read at once in threads,
                # another thread may still be reading it. It closes when its last reader lets
                # go of it.
                clients.files.popitem(last=False)
        return handle

    def strip(self, path: str | os.PathLike[str]) -> str:
        """``path`` without its protocol, in the form both filesystems accept."""
        text = os.fspath(path)
        if self.is_local:
            _, bare = split_protocol(text)
            return os.path.abspath(os.path.expanduser(str(bare)))
        return str(self.fsspec_class()._strip_protocol(text))

    def fsspec_class(self) -> type[AbstractFileSystem]:
        """The fsspec filesystem class (no connection made)."""
        try:
            return fsspec.get_filesystem_class(self.protocol)  # type: ignore[no-any-return]
        except ImportError as exc:  # s3fs, gcsfs, adlfs are extras of this package
            raise missing_filesystem(self.protocol, exc) from exc

    def url(self, path: str) -> str:
        """``path`` with its protocol, for messages and fingerprints."""
        return path if self.is_local else f"{self.protocol}://{path}"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "storage_options": self._source,
            "backend": self.backend,
            "retry": self.retry,
            "retries": self.retries,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["protocol"],
            state["storage_options"],
            backend=state.get("backend", "auto"),
            retry=state.get("retry"),
            retries=state.get("retries"),
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FileSystemSpec)
            and self.protocol == other.protocol
            and self._source == other._source
            and self.backend == other.backend
        )

    def __hash__(self) -> int:
        return hash(self.protocol)

    def described(self) -> str:
        """What a dataset's repr says of its storage: nothing for local files read as is; else the
        protocol, the storage options' keys (never their values: they may be secrets) and a
        backend other than ``"auto"``."""
        options: dict[str, Any] = {} if self.refreshable else self.storage_options
        if self.is_local and not self.refreshable and not options and self.backend == "auto":
            return ""
        shown = (
            "<function>"
            if self.refreshable
            else "{" + ", ".join(f"{k!r}: ..." for k in sorted(options)) + "}"
        )
        backend = "" if self.backend == "auto" else f"storage_backend={self.backend!r}, "
        return f"protocol={self.protocol!r}, storage_options={shown}, {backend}"

    def __repr__(self) -> str:
        source = self._source
        options = "<function>" if callable(source) else f"<{', '.join(sorted(source)) or 'none'}>"
        return (
            f"FileSystemSpec(protocol={self.protocol!r}, storage_options={options}, "
            f"backend={self.backend!r})"
        )


def _claim_native_azure() -> None:
    if _native_azure.inherited:
        raise InvalidArgumentError(
            'storage_backend="arrow" with Azure in a forked process whose parent already used '
            "pyarrow's Azure filesystem: its connection pool is shared with the parent, and "
            'responses get mixed up between processes. Use multiprocessing_context="spawn", '
            'or storage_backend="fsspec" (the default for Azure)'
        )
    _native_azure.get()
