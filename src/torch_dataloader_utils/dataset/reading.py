"""Reading one planned source in a process: its `Reader` over the node-local cache, with what
the reader computes from the rows (a transform, tokens), and a packed dataset's `TokenReader`
over it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pyarrow as pa

from ..batching import Packing
from ..cache import ReadCache
from ..convert import Problem
from ..errors.on_error import FailureLog, OnError
from ..sources.planned import PlannedSource
from ..stream.read import Reader, Reads
from ..stream.tokens import TokenReader

__all__ = ["source_reader"]


def source_reader(
    planned: PlannedSource,
    *,
    packing: Packing | None,
    cache: ReadCache | None,
    check: Callable[[pa.RecordBatch], Problem | None] | None,
    on_error: OnError,
    failures: FailureLog,
    carried: Sequence[str] = (),
    mixed: int | None = None,
) -> Reads:
    """A reader of ``planned``'s plan. ``carried``: columns its batches also hold (those that
    name a sample); ``mixed``: a packed mixture's source number its documents carry."""
    options, output = planned.read_options, planned.output_columns
    if carried and options.columns is not None and output is not None:
        options = dataclasses.replace(options, columns=(*options.columns, *carried))
        output = (*output, *carried)
    derive = planned.derive
    if packing is not None and options.columns is None and options.filter is None:
        # A packed stream uses its token column alone: the others were decoded for nothing.
        if derive is None:
            options = dataclasses.replace(options, columns=(packing.column,))
            output = (packing.column,)
        elif derive.tokenize is not None and not derive.counts_rows:
            options = dataclasses.replace(options, columns=(derive.tokenize.column,))
            output = (packing.column,)
    fs = planned.fs
    if cache is not None:
        fs = cache.wrap(fs, planned.plan.files, immutable=planned.immutable)
    reader = Reader(
        planned.plan.chunks,
        planned.format,
        fs,
        options,
        output_columns=output,
        check=check,
        files=planned.plan.files,
        on_error=on_error,
        failures=failures,
        row_bytes=planned.plan.row_bytes,
        schema=planned.plan.schema,
        derive=derive,
        chunk_rows=planned.plan.chunk_rows if derive is not None else None,
    )
    if packing is None:
        return reader
    # Tokens made in the loader are checked against the census's, chunk by chunk.
    counted = planned.chunk_tokens if derive is not None else None
    return TokenReader(
        reader,
        packing.column,
        planned.plan.chunk_rows,
        packing.eos_token,
        source=mixed,
        chunk_tokens=counted,
    )
