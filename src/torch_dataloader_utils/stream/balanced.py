"""A balanced stream's batches (`planning.balanced.Balanced`): each read from the stream that
planned it, delivered in the order the stream's slots were given them.

Every source (its worker's stream on each rank) is read from the first batch of the window
the pass starts in, only once some batch of it is wanted here; its batches come in plan order
and those another rank takes (or this stream delivered before a resume) are passed over
before conversion, the rest kept until their turn. A window's batches of a source lie within
that window's batches of it, so what waits is at most a window's batches of this stream, and
each source holds the blocks it is reading (docs/adr/0032-balance-by-compute.md measures it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import DataError
from ..planning.balance import BalancedPass
from .blocks import Segment

__all__ = ["balanced_segments"]


def balanced_segments(
    balanced: BalancedPass, segments: Callable[[Any], Iterator[Segment]]
) -> Iterator[Segment]:
    """The batches of a balanced stream, before conversion, from where its pass starts.

    Args:
        balanced: what the pass reads (`BalancedPass`).
        segments: the batches of a source stream (`planning.streams.Stream`), from where its
            pass starts.

    Raises:
        DataError: a source ended before a batch its plan counted (the files changed).
    """
    picks = np.asarray(balanced.picks, dtype=np.int64)
    wanted: dict[int, set[int]] = {}
    for source, batch in picks.tolist():
        wanted.setdefault(source, set()).add(batch)
    readers: dict[int, Iterator[Segment]] = {}
    at: dict[int, int] = {}  # each source's next batch
    kept: dict[tuple[int, int], Segment] = {}
    try:
        for source, batch in picks.tolist():
            segment = kept.pop((source, batch), None)
            while segment is None:
                reader = readers.get(source)
                if reader is None:
                    reader = readers[source] = segments(balanced.sources[source])
                    at[source] = balanced.first
                index = at[source]
                got = next(reader, None)
                if got is None:
                    raise DataError(
                        f"rank {source}'s stream ended at batch {index}, before its batch "
                        f"{batch} that planning counted; were the files changed while reading?"
                    )
                at[source] = index + 1
                if index == batch:
                    segment = got
                elif index in wanted[source]:
                    kept[(source, index)] = got
            wanted[source].discard(batch)
            yield segment
    finally:
        for reader in readers.values():
            close = getattr(reader, "close", None)
            if close is not None:
                close()
