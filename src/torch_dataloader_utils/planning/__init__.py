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
from .resume import (
    Layout,
    Leg,
    block_start,
    consumed,
    epoch_sequence,
    remaining,
    round_robin,
    stream_batches,
    stream_spans,
)
from .sequence import (
    Deferred,
    Item,
    Run,
    cut,
    round_robin_runs,
    run_pieces,
    sequence_length,
    stream_runs,
)
from .shuffle import block_bounds, block_permutation
from .topology import Topology, resolve_rank

__all__ = [
    "REMAINDER_POLICIES",
    "SPLIT_STRATEGIES",
    "Chunk",
    "Deferred",
    "Item",
    "Layout",
    "Leg",
    "Piece",
    "Plan",
    "Remainder",
    "Run",
    "SplitStrategy",
    "Topology",
    "assign_stream",
    "block_bounds",
    "block_permutation",
    "block_start",
    "chunk_order",
    "consumed",
    "cut",
    "epoch_sequence",
    "rank_span",
    "remaining",
    "resolve_rank",
    "round_robin",
    "round_robin_runs",
    "run_pieces",
    "sequence_length",
    "span_pieces",
    "stream_batches",
    "stream_runs",
    "stream_spans",
    "worker_span",
]
