"""`convert.last_block.LastBlock`: a value made from the block converted last, given back only
for that same block, and never keeping the block alive."""

from __future__ import annotations

import gc
import weakref

import pyarrow as pa

from torch_dataloader_utils.convert.last_block import LastBlock


def block(n: int) -> pa.RecordBatch:
    return pa.record_batch({"x": list(range(n))})


def test_the_value_is_the_last_blocks_only() -> None:
    last: LastBlock[str] = LastBlock()
    first, second = block(3), block(3)
    assert last.get(first) is None
    assert last.keep(first, "first's") == "first's"
    assert last.get(first) == "first's"
    assert last.get(second) is None  # an equal block is another block
    last.keep(second, "second's")
    assert last.get(second) == "second's" and last.get(first) is None


def test_the_block_is_not_kept_alive() -> None:
    last: LastBlock[int] = LastBlock()
    gone = block(4)
    alive = weakref.ref(gone)
    last.keep(gone, 4)
    del gone
    gc.collect()
    assert alive() is None
    assert last.get(block(4)) is None
