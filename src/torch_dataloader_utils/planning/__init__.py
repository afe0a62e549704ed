"""Planning: the plan (chunks), the topology, and the pure assignment of rows to streams."""

from .assign import (
    REMAINDER_POLICIES,
    Piece,
    Remainder,
    assign_stream,
    chunk_order,
    rank_span,
    span_pieces,
    worker_span,
)
from .plan import Chunk, Plan
from .shuffle import block_bounds, block_permutation
from .topology import Topology, resolve_rank

__all__ = [
    "REMAINDER_POLICIES",
    "Chunk",
    "Piece",
    "Plan",
    "Remainder",
    "Topology",
    "assign_stream",
    "block_bounds",
    "block_permutation",
    "chunk_order",
    "rank_span",
    "resolve_rank",
    "span_pieces",
    "worker_span",
]
