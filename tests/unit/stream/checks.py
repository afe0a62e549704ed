"""What the packing tests check of a batch of tokens, shared by test_fragments, test_packing and
test_best_fit (test modules import these from here, never from each other)."""

from __future__ import annotations

import itertools

import numpy as np

from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.packing import Packed


def triples(fragments: Fragments) -> list[tuple[int, int, int]]:
    """Each token of ``fragments`` in order, with its document and position (read from the
    buffers laid end to end, not through `Fragments.tokens`)."""
    values = np.concatenate(fragments.buffers)
    out = []
    for b, e, d, p in zip(
        fragments.begin, fragments.end, fragments.document, fragments.position, strict=True
    ):
        out += [(int(values[b + i]), int(d), int(p + i)) for i in range(e - b)]
    assert [t for t, _, _ in out] == fragments.tokens().tolist()
    assert len(out) == fragments.num_rows
    return out


def check_positions(packed: Packed, in_document: list[int], positions: str) -> None:
    """``position_ids``: each real token's position in its document (``in_document``, in
    order) with ``positions="document"``, else its place in its ``cu_seqlens`` fragment; the
    padding counts from 0 in its fragment either way."""
    cu = packed.cu_seqlens.tolist()
    place = [i - a for a, b in itertools.pairwise(cu) for i in range(a, b)]
    got = packed.position_ids.reshape(-1).tolist()
    real = (packed.document_ids.reshape(-1) >= 0).tolist()
    assert [g for g, r in zip(got, real, strict=True) if not r] == [
        p for p, r in zip(place, real, strict=True) if not r
    ]
    in_fragment = [p for p, r in zip(place, real, strict=True) if r]
    want = in_document if positions == "document" else in_fragment
    assert [g for g, r in zip(got, real, strict=True) if r] == want
