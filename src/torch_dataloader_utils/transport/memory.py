"""Where a worker's pooled buffers live: a memfd, else /dev/shm with room checked, else none.

A container's ``/dev/shm`` is small by default (Docker and Kubernetes give it 64 MiB), while a
worker's pool holds several bundles of up to 16 MiB. So, in this order (ADR 0018):

1. **memfd** (Linux): anonymous shared memory from ``memfd_create``, not bounded by the size of
   ``/dev/shm``, and as fast to fill and to map. It counts against the container's memory
   limit, as ``/dev/shm`` does: past that limit the kernel kills the worker (a
   `WorkerDiedError`), as it would for any memory.
2. **/dev/shm**, through torch, where memfd is missing or refused: bundles are sized from the
   room ``statvfs`` reports when a worker starts (`bundle_bytes`), and a buffer is asked of
   torch only when ``/dev/shm`` has room for it now (a failed torch allocation leaves its file
   behind in ``/dev/shm``).
3. **none**: a bundle no shared memory has room for is sent through the pipe as bytes (one
   copy more), not an error.

``TDU_SHARED_MEMORY=dev-shm`` skips the memfd (to test, or where a memfd is unwanted).
"""

from __future__ import annotations

import logging
import mmap
import os
import sys
from multiprocessing.reduction import DupFd
from typing import Any, NamedTuple

import torch
import torch.multiprocessing

from .descriptors import keep_socket_path_short

__all__ = [
    "BUNDLE_BYTES",
    "DEV_SHM",
    "POOL_BUFFERS",
    "POOL_GRAIN",
    "Buffer",
    "bundle_bytes",
    "dev_shm_fits",
    "dev_shm_room",
    "memory_kind",
    "new_buffer",
    "no_room",
    "remove_left_behind",
    "room_log",
]

_log = logging.getLogger(__name__)

# A bundle closes at this many bytes: each message costs the main process CPU of its own, so
# wide rows want large bundles
# (docs/adr/0020-measurements-behind-constants.md#workers-and-the-transport).
BUNDLE_BYTES = 16 * 2**20

DEV_SHM = "/dev/shm"

# Buffers a worker's pool keeps (`BufferPool.size`), counted when sizing bundles.
POOL_BUFFERS = 6
# A new buffer is rounded up to this, so that a slightly larger next message still fits it.
POOL_GRAIN = 1 << 20

# What a buffer holds besides a bundle's values (its header, each value's alignment): a bundle
# closes this much short of its buffer's grains.
_BUFFER_SLACK = POOL_GRAIN // 16

# Of the room /dev/shm has when a worker starts, the share our bundles may use: the rest stays
# for everything else on the machine that needs it (other ranks' loaders, NCCL, torch).
_ROOM_SHARE = 0.5


class Buffer(NamedTuple):
    """A shared buffer: the tensor to write into, and what pickles as its memory (the tensor
    itself for torch's shared memory, a `_Memfd` for a memfd)."""

    tensor: torch.Tensor
    carrier: Any


def memory_kind() -> str:
    """``"memfd"`` or ``"dev-shm"``: where this process's new buffers go."""
    global _kind
    if _kind is None:
        _kind = "memfd" if _memfd_works() else "dev-shm"
    return _kind


_kind: str | None = None


def _memfd_works() -> bool:
    if os.environ.get("TDU_SHARED_MEMORY", "").strip().lower() == "dev-shm":
        return False
    create = getattr(os, "memfd_create", None)
    if create is None or sys.platform != "linux":
        return False
    try:
        os.close(create("tdu-probe", os.MFD_CLOEXEC))
    except OSError as exc:  # seccomp profiles may refuse it (EPERM, ENOSYS)
        _log.info("memfd_create refused (%s): worker buffers go to %s", exc, DEV_SHM)
        return False
    return True


def new_buffer(nbytes: int) -> Buffer | None:
    """A new shared buffer of ``nbytes`` bytes, or None when shared memory has no room."""
    keep_socket_path_short()  # (its descriptor goes to the main process through a socket)
    if memory_kind() == "memfd":
        return _new_memfd(nbytes)
    if not dev_shm_fits(nbytes):
        return None
    try:
        return _new_dev_shm(nbytes)
    except RuntimeError as exc:  # torch: "unable to allocate shared memory(shm) ... (28)"
        if "shared memory" not in str(exc) and "shm" not in str(exc):
            raise
        remove_left_behind()
        return None


def dev_shm_fits(nbytes: int) -> bool:
    """Whether ``/dev/shm`` has room for ``nbytes`` more now (True where there is no
    ``/dev/shm`` to ask: macOS, Windows)."""
    size, free = dev_shm_room()
    return size == 0 or nbytes <= free


def remove_left_behind() -> None:
    """Unlink the files this process's failed torch allocations left in /dev/shm (another
    process may have taken the room between our check and torch's). Under torch's default
    strategy a file that worked is unlinked at once, so every one left is a failure's."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":  # type: ignore[no-untyped-call]
        return
    prefix = f"torch_{os.getpid()}_"
    try:
        names = [n for n in os.listdir(DEV_SHM) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(DEV_SHM, name))
        except OSError:
            continue


def _new_dev_shm(nbytes: int) -> Buffer:
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # private in torch: fall back to the public (one more copy) way
        shared: torch.Tensor = torch.empty(nbytes, dtype=torch.uint8)
        shared.share_memory_()  # type: ignore[no-untyped-call]
    else:
        shared = torch.empty(0, dtype=torch.uint8).set_(new_shared(nbytes))
    return Buffer(shared, shared)


class _Memfd:
    """A memfd's file descriptor, open while the pool or a message not yet sent holds it; it
    pickles as a duplicate of the descriptor (as torch passes its own shared memory)."""

    __slots__ = ("fd", "nbytes")

    def __init__(self, fd: int, nbytes: int) -> None:
        self.fd, self.nbytes = fd, nbytes

    def __reduce__(self) -> tuple[Any, ...]:
        return (_mapped, (DupFd(self.fd), self.nbytes))

    def __del__(self) -> None:
        os.close(self.fd)


def _new_memfd(nbytes: int) -> Buffer | None:
    try:
        carrier = _Memfd(os.memfd_create("tdu-bundle", os.MFD_CLOEXEC), nbytes)
        os.ftruncate(carrier.fd, nbytes)
        memory = mmap.mmap(carrier.fd, nbytes)
    except OSError:  # out of descriptors or address space: the pipe instead
        return None
    return Buffer(torch.frombuffer(memory, dtype=torch.uint8), carrier)


def _mapped(fd: Any, nbytes: int) -> torch.Tensor:
    """A memfd received from another process, mapped here (the tensor keeps the mapping)."""
    own = fd.detach()
    try:
        memory = mmap.mmap(own, nbytes)
    finally:
        os.close(own)
    return torch.frombuffer(memory, dtype=torch.uint8)


def dev_shm_room() -> tuple[int, int]:
    """``/dev/shm``'s size and the bytes free in it now (0, 0 where there is none)."""
    try:
        stat = os.statvfs(DEV_SHM)
    except (OSError, AttributeError):
        return 0, 0
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize


def bundle_bytes(workers: int, *, tell: bool = True) -> int:
    """The bytes at which a bundle closes in this (worker) process, one of ``workers``.

    `BUNDLE_BYTES` in a memfd; in /dev/shm, what its room when the worker starts allows, for
    every worker of every rank on this machine (``LOCAL_WORLD_SIZE``) holding a full pool.
    Smaller bundles cost the main process more CPU a row, never rows. ``tell``: log it when
    bundles are shrunk (one worker of a loader tells).
    """
    size, free = dev_shm_room()
    if memory_kind() == "memfd" or size == 0:  # (no /dev/shm to size for: macOS, Windows)
        return BUNDLE_BYTES
    ranks = _local_ranks()
    share = int(free * _ROOM_SHARE) // max(1, workers * ranks * POOL_BUFFERS)
    # Buffers are whole grains: a bundle fills the grains of its share, and at least one (no
    # buffer is smaller, so a smaller bundle would take as much memory in more messages).
    fits = max(1, share // POOL_GRAIN) * POOL_GRAIN - _BUFFER_SLACK
    if fits >= BUNDLE_BYTES:
        return BUNDLE_BYTES
    if tell:
        room_log(
            "shrunk",
            f"{DEV_SHM} has {_mib(free)} free of {_mib(size)}: bundles shrunk from "
            f"{_mib(BUNDLE_BYTES)} to {_mib(fits)} for {workers} worker(s) x {ranks} local "
            "rank(s)",
        )
    return fits


def no_room(nbytes: int, *, dev_shm: bool = False) -> str:
    """Why a buffer of ``nbytes`` could not be made (for `room_log`); ``dev_shm``: torch's
    own shared memory, whatever this process's kind."""
    if memory_kind() == "memfd" and not dev_shm:
        return f"no memfd of {_mib(nbytes)} could be made (out of descriptors or address space)"
    size, free = dev_shm_room()
    return f"{DEV_SHM} ({_mib(free)} free of {_mib(size)}) has no room for {_mib(nbytes)}"


def _local_ranks() -> int:
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


_logged: set[str] = set()


def room_log(kind: str, message: str) -> None:
    """Log ``message`` at INFO, once per process and ``kind``: shared memory lacked room."""
    if kind in _logged:
        return
    _logged.add(kind)
    _log.info(
        "%s (raise it: docker run --shm-size=1g; Kubernetes: an emptyDir with medium: Memory "
        "mounted at %s)",
        message,
        DEV_SHM,
    )


def _mib(nbytes: int) -> str:
    """``nbytes`` for a log line: in MiB, or in KiB below one (never a "0.0 MiB" that is not
    nothing)."""
    if nbytes < 2**20:
        return f"{nbytes / 2**10:.0f} KiB"
    return f"{nbytes / 2**20:.1f} MiB"
