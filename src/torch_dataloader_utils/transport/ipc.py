"""Arrow batches (``output_format="arrow"``) sent in a worker's pooled shared buffers
(`ArrowBundle`): each batch written there as an Arrow IPC stream by pyarrow (`pack_arrow`), and
read in the main process without a copy.

Pickled, a batch's bytes are copied into the pickle and through the pipe; as IPC they are copied
once, into the shared buffer, and read in place: several times cheaper for the worker and the
main process (docs/adr/0020-measurements-behind-constants.md#workers-and-the-transport).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import torch

from . import buffers
from .buffers import (
    _ALIGN,
    _HEADER,
    BufferBundle,
    _release,
    _round_up,
    incoming,
    take_buffer,
)
from .wire import Bundle

__all__ = ["ArrowBundle", "pack_arrow"]

Arrow: TypeAlias = pa.RecordBatch | pa.Table

# Where each output lies in the buffer: its stream's first byte, its bytes, and whether it is
# a table (a shuffle block left in parts: each part a batch of the stream) or a record batch.
_Place = tuple[int, int, bool]


class ArrowBundle(BufferBundle):
    """Consecutive Arrow outputs of one worker, each an IPC stream in one shared buffer.

    The buffer comes from the worker's pool and is pickled as a `PackedBundle`'s is (its memory
    with the first message in it, later its serial: `buffers.outgoing`). A bundle no shared
    memory had room for has a private buffer, sent as bytes.
    """

    __slots__ = ("places",)

    def __init__(
        self,
        buffer: torch.Tensor,
        places: list[_Place],
        end: int,
        worker: int = -1,
        *,
        serial: int | None = None,
        dropped: tuple[int, ...] = (),
        carrier: Any = None,
        pooled: bool = False,
    ) -> None:
        super().__init__(
            buffer, end, worker, serial=serial, dropped=dropped, carrier=carrier, pooled=pooled
        )
        self.places = places

    def __reduce__(self) -> tuple[Any, ...]:
        state = (self.places, self.end, self.worker, self.failures)
        return (_unpickled, (*self.carried(), state))

    def pin_memory(self) -> ArrowBundle:
        """Itself (called by the DataLoader's pin-memory thread): Arrow holds no tensors."""
        return self

    def unpack(self) -> list[Arrow]:
        """The outputs, in order, their buffers slices of the bundle's buffer (no copy).

        A shared buffer is lent (`buffers.Lent`), as a torch bundle's is: the Arrow memory is
        a tensor view of the lent storage (through numpy, which keeps the view alive), so the
        storage's use count stays up while any batch, column or slice read from it lives, and
        the buffer goes back to the worker's pool only once the user has dropped them all.
        Without torch's use count the bytes are copied out first.
        """
        if not self.pooled:  # private memory, ours alone: nothing to give back
            memory = pa.py_buffer(self.buffer.numpy()[: self.end])
            return [_read(memory, place) for place in self.places]
        buffers._lent.settle()  # (before taking in another: buffers given back, reused soonest)
        own = buffers._lent.lend(self.buffer)
        if own is None:
            memory = pa.py_buffer(self.buffer.numpy()[: self.end].copy())
        else:
            memory = pa.py_buffer(own[: self.end].numpy())  # (a view: counted as a use)
        outputs = [_read(memory, place) for place in self.places]
        if own is None:  # (the copy is complete: program order, as in PackedBundle.unpack)
            _release(self.buffer)
        return outputs


def _read(memory: pa.Buffer, place: _Place) -> Arrow:
    start, nbytes, table = place
    reader = pa.ipc.open_stream(memory.slice(start, nbytes))
    output: Arrow = reader.read_all() if table else reader.read_next_batch()
    return output


def _unpickled(
    memory: torch.Tensor | np.ndarray | None,
    owner: tuple[int, int] | None,
    serial: int,
    dropped: tuple[int, ...],
    state: tuple[Any, ...],
) -> ArrowBundle:
    buffer, pooled = incoming(memory, owner, serial, dropped)
    places, end, worker, failures = state
    bundle = ArrowBundle(buffer, places, end, worker, carrier=buffer, pooled=pooled)
    bundle.failures = failures
    return bundle


def pack_arrow(outputs: Sequence[Any]) -> ArrowBundle | Bundle:
    """Write Arrow ``outputs`` (record batches, tables) into one shared buffer as IPC streams.

    Anything IPC would not give back as it was, or cannot write, is pickled instead (a sealed
    `Bundle`): other outputs, and a Python-defined extension type, which the main process
    reads back as its storage type unless it has registered the type too.
    """
    sizes = _stream_sizes(outputs)
    if sizes is None:
        return Bundle(list(outputs)).seal()
    places: list[_Place] = []
    offset = _HEADER
    for output, nbytes in zip(outputs, sizes, strict=True):
        places.append((offset, nbytes, isinstance(output, pa.Table)))
        offset += _round_up(nbytes, _ALIGN)
    taken, pooled = take_buffer(offset - _HEADER)
    target = taken.buffer.numpy()
    for output, (start, nbytes, _) in zip(outputs, places, strict=True):
        memory = pa.py_buffer(target[start : start + nbytes])
        if not memory.is_mutable:  # (pyarrow's writer would abort the process, not raise)
            raise RuntimeError("a shared buffer is read-only in the worker that fills it")
        _write(output, pa.FixedSizeBufferWriter(memory))
    return ArrowBundle(
        taken.buffer,
        places,
        offset,
        serial=taken.serial if pooled else None,
        dropped=taken.dropped,
        carrier=taken.carrier,
        pooled=pooled,
    )


def _stream_sizes(outputs: Sequence[Any]) -> list[int] | None:
    """Each output's IPC stream's bytes (written to a stream that only counts them), or None
    when one is not to be sent as IPC."""
    sizes = []
    for output in outputs:
        if not isinstance(output, pa.RecordBatch | pa.Table) or any(
            map(_python_extension, output.schema.types)
        ):
            return None
        counter = pa.MockOutputStream()
        try:
            _write(output, counter)
        except pa.ArrowException:  # a type IPC cannot write: pickle tells what it can
            return None
        sizes.append(counter.size())
    return sizes


def _write(output: Arrow, sink: pa.NativeFile) -> None:
    with pa.ipc.new_stream(sink, output.schema) as writer:
        writer.write(output)


def _python_extension(type_: pa.DataType) -> bool:
    if isinstance(type_, pa.ExtensionType):
        return True
    if isinstance(type_, pa.BaseExtensionType):  # (Arrow's canonical ones: registered always)
        return _python_extension(type_.storage_type)
    if isinstance(type_, pa.DictionaryType):
        return _python_extension(type_.value_type)
    return any(_python_extension(type_.field(i).type) for i in range(type_.num_fields))
