"""Moving batches from DataLoader workers to the main process cheaply.

Each tensor that crosses from a worker costs most of its time creating and passing a new
shared-memory region, not copying bytes (docs/adr/0003-bundled-packed-transport.md). So a worker
of a `TabularDataLoader` sends *bundles*: several consecutive
batches in one message, and for torch output all their numeric data packed into ONE shared
buffer, allocated directly in shared memory. The main process slices the buffer into per-batch
views (a few microseconds) and yields the batches one by one, so users see ordinary batches.

Bundling is switched on per worker process by the loader's ``worker_init_fn``; a dataset
iterated by a plain ``DataLoader`` (or in the main process) yields plain batches.

- `wire`: the messages (`Bundle`, `PackedBundle`), packed and unpacked;
- `ipc`: Arrow output's messages (`ArrowBundle`): IPC streams in the same shared buffers;
- `values`: how each value of a packed batch lies in its buffer (strings, pickled values);
- `buffers`: the shared memory they live in (`BufferPool` in a worker; in the main process
  `Received`, each buffer mapped once, and `Lent`, buffers whose views the batches are, given
  back once those are gone);
- `worker`: the worker side (`worker_messages`, `init_worker`);
- `main`: the main-process side (`Unbundler`, `in_order`).
"""

from .buffers import BufferPool, Lent, Received
from .device import to_device
from .ipc import ArrowBundle, pack_arrow
from .main import Unbundler, in_order
from .memory import BUNDLE_BYTES
from .wire import (
    Bundle,
    PackedBundle,
    forget_exited_workers,
    map_tensors,
    pack,
    pack_planned,
    packed_nbytes,
)
from .worker import bundle_rows, enable_bundles, init_worker, starting_workers, worker_messages

__all__ = [
    "BUNDLE_BYTES",
    "ArrowBundle",
    "Bundle",
    "BufferPool",
    "Lent",
    "PackedBundle",
    "Received",
    "Unbundler",
    "bundle_rows",
    "enable_bundles",
    "forget_exited_workers",
    "in_order",
    "init_worker",
    "map_tensors",
    "pack",
    "pack_arrow",
    "pack_planned",
    "packed_nbytes",
    "starting_workers",
    "to_device",
    "worker_messages",
]
