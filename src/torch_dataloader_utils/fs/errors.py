"""Translate third-party storage errors into our hierarchy: by type, else by the status in
pyarrow's message (see `retry`); a protocol's missing fsspec package, into the pip extra that
installs it."""

from __future__ import annotations

from ..errors import (
    MissingDependencyError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
)
from .native import NATIVE_PROTOCOLS
from .retry import is_missing, is_refused, scrub

__all__ = ["missing_filesystem", "translate_os_error"]

# The extra of this package that installs each protocol's fsspec filesystem (pyproject.toml):
# named as the native families are, Azure Data Lake Gen1 with the rest of Azure, the Hub "hf".
_EXTRAS = {**NATIVE_PROTOCOLS, "adl": "azure", "hf": "hf"}


def translate_os_error(exc: OSError, url: str) -> StorageError:
    """Map an ``OSError`` raised while touching ``url`` to the matching `StorageError`.

    The caller raises the result ``from exc``.
    """
    if isinstance(exc, StorageError):
        return exc
    detail = scrub(exc.strerror or str(exc) or type(exc).__name__)
    # pyarrow's native filesystems raise plain OSError: read the status from the message.
    if is_missing(exc):
        return StorageNotFoundError(f"{url}: not found ({detail})")
    if is_refused(exc):
        return StoragePermissionError(f"{url}: permission denied ({detail})")
    return StorageError(f"{url}: {detail}")


def missing_filesystem(protocol: str, exc: ImportError) -> MissingDependencyError:
    """The error for ``protocol``'s fsspec filesystem failing to import (``exc``, fsspec's
    "Install s3fs to access S3"), naming the pip extra that installs it. The caller raises the
    result ``from exc``."""
    extra = _EXTRAS.get(protocol)
    how = (
        f"pip install 'torch-dataloader-utils[{extra}]'"
        if extra is not None
        else "install the package fsspec names"
    )
    return MissingDependencyError(
        f"{protocol}:// paths need a package not installed ({exc}): {how}"
    )
