"""Factories of ORC and Arrow IPC files shared by the unit, conformance and remote tests.

Rows are `make_table` rows (values are functions of the id), so a reader's output can be checked
from its ids alone. Test modules import these from here, never from each other.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.orc as orc

from tests.conftest import make_table
from torch_dataloader_utils.fs import FileSystemSpec

# File suffix of each format's files.
SUFFIX = {"orc": "orc", "ipc": "arrow"}


def write_orc(
    path: Path, ids: np.ndarray, *, stripe_rows: int = 100, compression: str = "uncompressed"
) -> Path:
    """``make_table(ids)`` as ORC with stripes of ``stripe_rows`` rows (uncompressed: a
    compressed writer sizes stripes by its 64 KiB compression buffers, so small data makes one
    stripe)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = make_table(ids)
    orc.write_table(table, path, stripe_size=1, batch_size=stripe_rows, compression=compression)
    return path


def ipc_table(ids: np.ndarray) -> pa.Table:
    """`make_table` plus a dictionary-encoded column (streams carry dictionary messages)."""
    table = make_table(ids)
    kinds = pa.array([f"kind-{i % 3}" for i in np.asarray(ids)], pa.string()).dictionary_encode()
    return table.append_column("kind", kinds)


def write_ipc(
    path: Path,
    ids: np.ndarray,
    *,
    batch_rows: int = 100,
    stream: bool = False,
    compression: str | None = None,
    legacy: bool = False,
) -> Path:
    """``ipc_table(ids)`` as an IPC file (or stream) of ``batch_rows``-row record batches."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = ipc_table(ids)
    options = ipc.IpcWriteOptions(compression=compression, use_legacy_format=legacy)
    new = ipc.new_stream if stream else ipc.new_file
    with new(str(path), table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    return path


def write_orc_ipc_source(root: Path, fmt: str, files: list[tuple[int, int]]) -> Path:
    """Files of ``fmt`` (``"orc"`` or ``"ipc"``) under ``root``, one per ``(rows, rows per
    stripe or record batch)`` in ``files``, with ids 0.. across them in name order; IPC
    alternates file and stream format, and compresses the third file."""
    start = 0
    for i, (rows, unit) in enumerate(files):
        ids = np.arange(start, start + rows)
        path = root / f"p{i}.{SUFFIX[fmt]}"
        if fmt == "orc":
            write_orc(path, ids, stripe_rows=unit)
        else:
            write_ipc(
                path, ids, batch_rows=unit, stream=i % 2 == 1, compression=(None, "zstd")[i == 2]
            )
        start += rows
    return root


class RecordingSpec(FileSystemSpec):
    """A real local spec that records each range request."""

    def __init__(self) -> None:
        super().__init__("file")
        self.calls: list[tuple[str, int, int]] = []
        self.calls_lock = threading.Lock()

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        with self.calls_lock:
            self.calls.append((path, offset, size))
        return super().read_range(path, offset, size)

    def bytes_read(self) -> int:
        return sum(c[2] for c in self.calls)
