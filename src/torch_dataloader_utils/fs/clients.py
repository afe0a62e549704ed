"""What one process builds from a `FileSystemSpec`: its options, clients, open files, and what
the store reported."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs

from .reported import Reported

__all__ = ["Clients"]


class Clients:
    """What one process builds from a spec: its options, filesystems, open files and what the
    store reported of its files (`fs.reported`).

    Kept per process (`fs.forks`): connections and client state taken over from a parent are
    unusable, and a parent's clients are never closed from a child, where closing them fails
    (docs/adr/0020-measurements-behind-constants.md#forked-processes). An options function is
    called again in each process.
    """

    def __init__(self) -> None:
        self.options: dict[str, Any] | None = None
        self.fsspec: fsspec.AbstractFileSystem | None = None
        self.arrow: pafs.FileSystem | None = None
        self.files: OrderedDict[str, pa.NativeFile] = OrderedDict()
        self.reported = Reported()  # sizes and metadata the store gave (kept on a refresh)
        self.lock = threading.Lock()  # files, and a refresh
        self.refresh_lock = threading.Lock()  # one refresh for all threads refused at once
        # Builds a client, and a refresh: no client built from options a refresh dropped.
        self.build_lock = threading.RLock()
        self.options_lock = threading.Lock()  # fetch threads share one options call
