"""Concat packing's arrays in one pass, compiled by numba where it is installed (the ``fast``
extra): `concat`, which `stream.packing.pack` uses when it is loaded.

numpy makes a packed batch in several passes (the tokens copied fragment by fragment, then
positions and document ids each through `np.repeat`, then the boundaries sorted): 65-67 µs a
batch of 8 x 2,048 tokens, each pass at numpy's floor. One compiled pass writes them all in
28-29 µs (docs/adr/0034-a-compiled-packing-kernel.md). Without numba, or with
``TDU_COMPILED=0``, `concat` returns ``None`` and packing stays numpy's; both give the same
arrays (tests/unit/stream/test_pack_kernel.py).

Loading imports numba and compiles or loads the kernel from numba's cache: about 0.4 s once a
process (2-3 s the first time on a machine), so it happens once, when a packed dataset is made
(forked workers inherit it) or at a spawned worker's first batch.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..convert import Planned
from .fragments import MAX_BUFFERS, Fragments

__all__ = ["COMPILED_ENV", "Concatenated", "concat", "load", "most_cuts", "planned", "takes"]

logger = logging.getLogger("torch_dataloader_utils")

# Set to 0 to pack with numpy alone (the fallback, also where numba is missing).
COMPILED_ENV = "TDU_COMPILED"


@dataclass(frozen=True, slots=True)
class Concatenated:
    """A batch's packed arrays, flat (``size`` values each; ``source_ids`` a mixture's)."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    document_ids: np.ndarray
    source_ids: np.ndarray | None
    cu_seqlens: np.ndarray
    max_seqlen: int


def concat(
    fragments: Fragments,
    seq_len: int,
    size: int,
    *,
    pad_value: int,
    by_fragment: bool,
    into: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None = None,
    cuts_into: np.ndarray | None = None,
) -> Concatenated | None:
    """The arrays `stream.packing.pack` makes of ``fragments`` in ``size`` tokens (sequences
    of ``seq_len``, the tokens then padding), written ``into`` the flat arrays given
    (``input_ids``, ``position_ids``, ``document_ids``, a mixture's ``source_ids``) or new
    ones, and the boundaries into the start of ``cuts_into`` (`most_cuts` long) or a new
    array; ``None`` where the compiled kernel is not loaded (numba missing, or
    ``TDU_COMPILED=0``) or takes no tokens of this dtype (`takes`)."""
    kernel = _kernel(fragments)
    if kernel is None:
        return None
    if into is None:
        into = (
            np.empty(size, fragments.dtype),
            np.empty(size, np.int32),
            np.empty(size, np.int32),
            None if fragments.source is None else np.empty(size, np.int32),
        )
    if cuts_into is None:
        cuts_into = np.empty(most_cuts(fragments, seq_len, size), np.int32)
    assert len(cuts_into) >= most_cuts(fragments, seq_len, size), "room for every boundary"
    made, longest = _run(kernel, fragments, seq_len, size, pad_value, by_fragment, into, cuts_into)
    ids, positions, documents, sources = into
    return Concatenated(ids, positions, documents, sources, cuts_into[:made], longest)


def most_cuts(fragments: Fragments, seq_len: int, size: int) -> int:
    """The most boundaries `concat` writes for ``fragments`` in ``size`` tokens: each
    fragment's start, each sequence's, and the end."""
    return len(fragments.begin) + size // seq_len + 2


def takes(fragments: Fragments) -> bool:
    """Whether `concat` packs ``fragments`` (the kernel is loaded and takes their dtype)."""
    return _kernel(fragments) is not None


def planned(  # noqa: PLR0917 (`concat`'s arguments)
    fragments: Fragments,
    keys: list[str],
    seq_len: int,
    size: int,
    pad_value: int,
    by_fragment: bool,
) -> Planned:
    """`concat`'s arrays as a worker sends them (`transport.wire.pack_planned`), under
    ``keys`` (ids, positions, documents, and a mixture's sources where a fourth is given), with
    ``cu_seqlens`` and ``max_seqlen``: written where they go in one pass, which also settles the
    boundaries' count (in room for `most_cuts`) and ``max_seqlen`` (a Python int)."""
    shape = (size // seq_len, seq_len)
    sources = len(keys) > 3 and fragments.source is not None
    most = most_cuts(fragments, seq_len, size)
    int32 = np.dtype(np.int32)
    layout: list[tuple[str, Any, Any]] = [
        (keys[0], fragments.dtype, shape),
        (keys[1], int32, shape),
        (keys[2], int32, shape),
        ("cu_seqlens", int32, (most,)),
        ("max_seqlen", None, 0),
    ]
    if sources:
        layout.append((keys[3], int32, shape))

    def write(places: list[np.ndarray]) -> dict[int, Any]:
        ids, positions, documents, cuts, *rest = places
        source_ids = rest[0] if rest else None
        made = concat(
            fragments,
            seq_len,
            size,
            pad_value=pad_value,
            by_fragment=by_fragment,
            into=(ids, positions, documents, source_ids),
            cuts_into=cuts,
        )
        assert made is not None, "the kernel takes the fragments (`takes`)"
        return {3: (len(made.cu_seqlens),), 4: made.max_seqlen}

    return Planned(layout, write)


def _kernel(fragments: Fragments) -> Callable[..., tuple[int, int]] | None:
    if not _state.tried:
        load()
    return None if _state.kernel is None else _state.kernel.get(fragments.dtype)


def _run(  # noqa: PLR0917 (the kernel's arguments)
    kernel: Callable[..., tuple[int, int]],
    fragments: Fragments,
    seq_len: int,
    size: int,
    pad_value: int,
    by_fragment: bool,
    into: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None],
    cuts: np.ndarray,
) -> tuple[int, int]:
    ids, positions, documents, sources = into
    buffers = fragments.buffers
    if len(buffers) < MAX_BUFFERS:  # (the kernel takes a fixed number: the rest empty)
        buffers += (buffers[0][:0],) * (MAX_BUFFERS - len(buffers))
    made, longest = kernel(
        buffers,
        fragments.bases,
        fragments.begin,
        fragments.end,
        fragments.document,
        fragments.position,
        _NO_SOURCE if fragments.source is None else fragments.source,
        seq_len,
        size,
        pad_value,
        by_fragment,
        len(ids) > 0,
        ids,
        positions,
        documents,
        _NO_WRITTEN if sources is None else sources,
        cuts,
    )
    return int(made), int(longest)


_NO_SOURCE = np.zeros(0, np.int16)
_NO_WRITTEN = np.zeros(0, np.int32)


def concat_kernel(  # noqa: PLR0917 (numba's arguments are positional)
    buffers: tuple[np.ndarray, ...],
    bases: np.ndarray,
    begin: np.ndarray,
    end: np.ndarray,
    document: np.ndarray,
    position: np.ndarray,
    source: np.ndarray,
    seq_len: int,
    size: int,
    pad_value: int,
    by_fragment: bool,
    write: bool,
    ids: np.ndarray,
    positions: np.ndarray,
    documents: np.ndarray,
    sources: np.ndarray,
    cuts: np.ndarray,
) -> tuple[int, int]:
    """The kernel, in the Python numba compiles (tested as it is too, on small batches).

    Fragments that go on one from the other (the same document of the same source, its
    positions continued) are one document; a document starts a fragment (a cut), and so does
    every sequence; the padding after the tokens is a fragment in each sequence it fills.
    With ``write``, writes ``size`` tokens' ``ids``, ``positions`` (in the fragment, or in
    the document: ``by_fragment`` false), ``documents`` (numbered from 0; -1 padding) and
    ``sources`` (empty: none). Always writes the distinct cuts, then ``size``, into
    ``cuts``. Returns the cuts written and the longest fragment.

    The tokens are ``[begin, end)`` of ``buffers`` laid end to end, buffer ``k`` from
    ``bases[k]`` (``bases`` has one number for each buffer used; the rest are empty).
    """
    used = bases.shape[0]
    has_source = write and sources.shape[0] > 0
    t = 0  # tokens laid out
    next_sequence = 0
    made = 0
    document_id = -1
    run = 0  # the token's place in its fragment
    last_document, last_stop, last_source = -1, -1, -1
    for f in range(begin.shape[0]):
        b = begin[f]
        length = end[f] - b
        at = position[f]
        from_source = source[f] if source.shape[0] > 0 else 0
        if not (document[f] == last_document and at == last_stop and from_source == last_source):
            document_id += 1
            run = 0
            if made == 0 or cuts[made - 1] != t:
                cuts[made] = t
                made += 1
        last_document, last_stop, last_source = document[f], at + length, from_source
        stop = t + length
        while t < stop:
            if t == next_sequence:
                run = 0
                if made == 0 or cuts[made - 1] != t:
                    cuts[made] = t
                    made += 1
                next_sequence += seq_len
            piece = min(stop, next_sequence) - t
            if write:
                # The tokens, from each buffer that holds some (a fragment may run on into
                # the next: a document cut between two decoded parts, joined). Each array is
                # written through a loop over a view: numba's slice assignment took 22-26 µs
                # a batch against 16-18 (docs/adr/0034-a-compiled-packing-kernel.md).
                j = 0
                while j + 1 < used and bases[j + 1] <= b:
                    j += 1
                done = 0
                while done < piece:
                    buffer = buffers[j]
                    start = b + done - bases[j]
                    taken = min(piece - done, buffer.shape[0] - start)
                    dst = ids[t + done : t + done + taken]
                    src = buffer[start : start + taken]
                    for k in range(taken):
                        dst[k] = src[k]
                    done += taken
                    j += 1
                first = run if by_fragment else at
                placed = positions[t : t + piece]
                for k in range(piece):
                    placed[k] = first + k
                marked = documents[t : t + piece]
                for k in range(piece):
                    marked[k] = document_id
                if has_source:
                    origin = sources[t : t + piece]
                    for k in range(piece):
                        origin[k] = from_source
            b += piece
            t += piece
            run += piece
            at += piece
    while t < size:  # the padding: a fragment in each sequence it fills, each piece one
        if made == 0 or cuts[made - 1] != t:
            cuts[made] = t
            made += 1
        if t == next_sequence:
            next_sequence += seq_len
        piece = min(size, next_sequence) - t
        if write:
            ids[t : t + piece] = pad_value
            placed = positions[t : t + piece]
            for k in range(piece):
                placed[k] = k
            documents[t : t + piece] = -1
            if has_source:
                sources[t : t + piece] = -1
        t += piece
    if made == 0 or cuts[made - 1] != size:
        cuts[made] = size
        made += 1
    longest = 0
    for i in range(made - 1):
        longest = max(longest, cuts[i + 1] - cuts[i])
    return made, longest


class _State:
    """The loaded kernel of this process (``None``: numpy packs), loaded at most once."""

    def __init__(self) -> None:
        # The compiled kernel by the token dtype it takes (others pack with numpy).
        self.kernel: dict[np.dtype[Any], Callable[..., tuple[int, int]]] | None = None
        self.tried = False
        self.lock = threading.Lock()


_state = _State()


def load() -> bool:
    """Load the compiled kernel into this process once (numba imported, the kernel compiled
    or read from numba's cache); whether it is loaded.
    ``TDU_COMPILED=0``, or numba missing or failing, leaves numpy's packing, said once at
    DEBUG (it is an optional speed-up, the arrays are the same)."""
    with _state.lock:
        if not _state.tried:
            _state.tried = True
            _state.kernel = _compiled()
    return _state.kernel is not None


def _compiled() -> dict[np.dtype[Any], Callable[..., tuple[int, int]]] | None:
    """The kernel compiled (or read from numba's cache) for int32 and int64 tokens, each
    taking read-only token values (Arrow's buffers) as well as writable ones; ``None``
    where it cannot be."""
    if os.environ.get(COMPILED_ENV, "1") == "0":
        logger.debug("packing with numpy: %s=0", COMPILED_ENV)
        return None
    try:
        import numba
        from numba import types

        signatures = []
        for token in (types.int32, types.int64):
            tokens = types.Array(token, 1, "C")
            values = types.Array(token, 1, "C", readonly=True)
            counts = types.Array(types.int64, 1, "C", readonly=True)
            written = types.Array(types.int32, 1, "C")
            returns = types.UniTuple(types.int64, 2)  # type: ignore[no-untyped-call]
            signatures.append(
                returns(
                    types.UniTuple(values, MAX_BUFFERS),  # type: ignore[no-untyped-call]
                    counts,  # bases
                    counts,  # begin
                    counts,  # end
                    counts,  # document
                    counts,  # position
                    types.Array(types.int16, 1, "C", readonly=True),  # source
                    types.int64,  # seq_len
                    types.int64,  # size
                    types.int64,  # pad_value
                    types.boolean,  # by_fragment
                    types.boolean,  # write
                    tokens,  # ids
                    written,  # positions
                    written,  # documents
                    written,  # sources
                    written,  # cuts
                )
            )
        try:
            kernel = numba.njit(signatures, cache=True, nogil=True)(concat_kernel)
        except RuntimeError:  # (no writable place for numba's cache: compiled each process)
            kernel = numba.njit(signatures, nogil=True)(concat_kernel)
    except Exception as error:  # (ImportError, or a numba that cannot compile here)
        logger.debug("packing with numpy: the compiled kernel did not load (%s)", error)
        return None
    return {np.dtype(np.int32): kernel, np.dtype(np.int64): kernel}
