"""Planning: the plan (chunks), the topology, and the pure assignment of rows to streams."""

from .assign import (
    REMAINDER_POLICIES,
    SPLIT_STRATEGIES,
    Piece,
    Remainder,
    SplitStrategy,
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
    "SPLIT_STRATEGIES",
    "Chunk",
    "Piece",
    "Plan",
    "Remainder",
    "SplitStrategy",
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
