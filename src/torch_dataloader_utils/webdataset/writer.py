"""Write WebDataset shards that webdataset and DALI read, each with its DALI index beside it."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

from ..errors import InvalidArgumentError
from .index import ShardIndex, format_index, index_path
from .samples import Component, Sample
from .tar import BLOCK, padded

__all__ = ["ShardWriter"]

# PIL's format name for each image extension a sample may carry.
_IMAGE_FORMATS = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "bmp": "BMP",
    "tif": "TIFF",
    "tiff": "TIFF",
    "gif": "GIF",
}


class ShardWriter:
    """Write samples into numbered tar shards, like ``webdataset.ShardWriter``.

    A sample is a dict with ``"__key__"`` (str) and one entry per extension. Values are encoded
    by type: bytes as they are; str as UTF-8; int/float (and bool, as 0/1) as their decimal
    text (``cls``, ``index``...); dict/list as JSON (extension ``json``); numpy arrays with
    ``np.save`` (``npy``); torch tensors with ``torch.save`` (``pth``/``pt``); PIL images in the
    format of their extension (``jpg``, ``png``, ``webp``...). Entries whose name starts with
    ``_`` other than ``__key__`` are not written (webdataset's metadata, e.g. ``__url__``).

    Shards are deterministic: members in extension order (as webdataset writes them), mtime 0,
    uid/gid 0, mode 0o444. A new shard starts when the sample would pass ``maxcount`` samples
    or ``maxsize`` bytes (a sample larger than ``maxsize`` gets a shard of its own); no empty
    shard is ever written. With ``index=True`` each shard ``x.tar`` gets its DALI ``v1.2``
    index ``x.idx``, so readers skip the scan.

    Args:
        pattern: shard paths, a %-pattern of the shard number: ``"out/train-%06d.tar"``; an
            fsspec URL (``s3://...``) is written through fsspec.
        maxcount: samples per shard at most.
        maxsize: bytes per shard at most (tar headers and padding counted).
        index: write each shard's index beside it.
        start_shard: the first shard number.
        storage_options: fsspec options for URLs.

    Attributes:
        shards: the paths of the shards written so far (closed or being written).

    Example:
        >>> with ShardWriter("/tmp/out/train-%06d.tar", maxcount=1000) as sink:  # doctest: +SKIP
        ...     sink.write({"__key__": "000001", "jpg": jpeg_bytes, "cls": 3})
    """

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        *,
        index: bool = True,
        start_shard: int = 0,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if maxcount < 1 or maxsize < 1:
            raise InvalidArgumentError(f"maxcount and maxsize must be positive, got {maxcount}")
        try:
            pattern % start_shard
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"pattern must hold one %d-style field for the shard number, got {pattern!r}"
            ) from exc
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.index = index
        self.storage_options = dict(storage_options or {})
        self.shards: list[str] = []
        self._next = start_shard
        self._file: IO[bytes] | None = None
        self._tar: tarfile.TarFile | None = None
        self._samples: list[Sample] = []
        self._size = 0

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample.

        Raises:
            InvalidArgumentError: no ``__key__``, a key with a dot in its file name (readers
                would split it differently) or whitespace (with ``index=True``, DALI's index
                cannot hold it), an extension given twice up to case, or a value of a type
                that has no encoding for its extension.
        """
        key = _check_key(sample, index=self.index)
        members = _encode(key, sample, index=self.index)
        size = sum(BLOCK + padded(len(data)) for _, data in members)
        if self._tar is not None and (
            len(self._samples) + 1 > self.maxcount or self._size + size > self.maxsize
        ):
            self._finish()
        tar = self._tar if self._tar is not None else self._open()
        components = []
        for ext, data in members:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o444
            tar.addfile(info, io.BytesIO(data))
            # tarfile's offset is the end of the member's padded data
            components.append(Component(ext, tar.offset - padded(len(data)), len(data), info.name))
        self._samples.append(Sample(key, tuple(components)))
        self._size += size

    def close(self) -> None:
        """Finish the shard being written (and its index)."""
        if self._tar is not None:
            self._finish()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open(self) -> tarfile.TarFile:
        path = self.pattern % self._next
        self._next += 1
        self._file = _open_output(path, self.storage_options)
        # lives across write calls; _finish closes it, then the file
        self._tar = tarfile.TarFile(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)
        self.shards.append(path)
        return self._tar

    def _finish(self) -> None:
        assert self._tar is not None and self._file is not None
        self._tar.close()
        self._file.close()
        if self.index:
            text = format_index(ShardIndex(tuple(self._samples)))
            with _open_output(index_path(self.shards[-1]), self.storage_options) as f:
                f.write(text.encode("utf-8", "surrogateescape"))
        self._tar = self._file = None
        self._samples = []
        self._size = 0


def _open_output(path: str, storage_options: Mapping[str, Any]) -> IO[bytes]:
    if "://" not in path:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return open(path, "wb")
    import fsspec

    opened: IO[bytes] = fsspec.open(path, "wb", **storage_options).open()
    return opened


def _check_key(sample: Mapping[str, Any], *, index: bool) -> str:
    key = sample.get("__key__")
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"a sample needs a non-empty str '__key__', got {key!r}")
    base = key[key.rfind("/") + 1 :]
    if not base or "." in base or "\0" in key:
        raise InvalidArgumentError(
            f"sample key {key!r}: its file name must be non-empty and hold no dot (readers "
            "split member names at the first dot of the file name)"
        )
    if index and any(ch.isspace() for ch in key):
        raise InvalidArgumentError(
            f"sample key {key!r} holds whitespace, which DALI's index cannot describe; "
            "pass index=False to write it anyway"
        )
    return key


def _encode(key: str, sample: Mapping[str, Any], *, index: bool) -> list[tuple[str, bytes]]:
    members = []
    seen: dict[str, str] = {}
    for ext in sorted(sample):
        if not isinstance(ext, str):
            raise InvalidArgumentError(f"sample {key!r}: extension {ext!r} is not a str")
        if ext.startswith("_"):
            continue
        if not ext or "/" in ext or "\0" in ext or (index and any(c.isspace() for c in ext)):
            raise InvalidArgumentError(f"sample {key!r}: invalid extension {ext!r}")
        if ext.lower() in seen:
            raise InvalidArgumentError(
                f"sample {key!r}: extensions {seen[ext.lower()]!r} and {ext!r} differ only in "
                "case; readers lower-case extensions, so they would collide"
            )
        seen[ext.lower()] = ext
        members.append((ext, _encode_value(key, ext, sample[ext])))
    if not members:
        raise InvalidArgumentError(f"sample {key!r} has no components")
    return members


def _encode_value(key: str, ext: str, value: Any) -> bytes:
    last = ext.rsplit(".", 1)[-1].lower()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int | float):
        return str(value).encode("ascii")
    if isinstance(value, dict | list) and last == "json":
        return json.dumps(value).encode("utf-8")
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and last == "npy":
        out = io.BytesIO()
        numpy.save(out, value, allow_pickle=False)
        return out.getvalue()
    if numpy is not None and isinstance(value, numpy.generic) and value.ndim == 0:
        return str(value.item()).encode("ascii")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and last in ("pth", "pt"):
        out = io.BytesIO()
        torch.save(value, out)
        return out.getvalue()
    image = sys.modules.get("PIL.Image")
    if image is not None and isinstance(value, image.Image) and last in _IMAGE_FORMATS:
        out = io.BytesIO()
        value.save(out, format=_IMAGE_FORMATS[last])
        return out.getvalue()
    raise InvalidArgumentError(
        f"sample {key!r}: no encoding of a {type(value).__name__} for extension {ext!r} (bytes, "
        "str, int, float; dict/list for json; numpy arrays for npy; torch tensors for pth; "
        "PIL images for jpg/png/webp...)"
    )
