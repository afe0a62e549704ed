"""How a dataset's rows become its output (`conversion`): the converter, the checks each
source's reader runs, and the collate step (a format's decoders); a packed dataset's batches
of tokens become sequences instead (`stream.packing.PackedConverter`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..convert import Converter, Decoding, Output
from ..convert.rules import Problem
from ..errors import UnsupportedTypeError
from ..options import Options
from ..sources.planned import PlannedSource
from ..stream.packing import PackedConverter
from ..transport.worker import Converts

__all__ = ["Conversion", "conversion"]


@dataclass(frozen=True)
class Conversion:
    """What `conversion` makes.

    Attributes:
        converter: the dataset's conversion of a batch.
        checks: each source's check of its rows, which its reader runs (where the file and
            rows are known, so an error names them).
        collate: the collate step (a format's decoders before the user's ``collate_fn``).
        carried: columns read only to name a sample whose value does not decode.
    """

    converter: Converts
    checks: tuple[Callable[[pa.RecordBatch], Problem | None], ...]
    collate: Callable[[Any], Any] | None
    carried: tuple[str, ...]


def conversion(  # noqa: PLR0917 (what of the dataset it is made from)
    sources: Sequence[PlannedSource],
    schema: pa.Schema,
    output: Output,
    options: Options,
    collate_fn: Callable[[Any], Any] | None,
    source_key: str | None,
) -> Conversion:
    """The conversion of a dataset of ``sources`` whose rows have ``schema``."""
    decoders: dict[str, Any] = {}
    if output.format != "arrow":
        for source in sources:
            for name, decoder in source.format.decoders(source.plan.schema).items():
                decoders.setdefault(name, decoder)
    # Read with the columns that name a sample (every source has them), so that a value that
    # does not decode is named by its file and sample whatever the columns asked for; dropped
    # after decoding.
    carried = tuple(
        c
        for c in sources[0].format.sample_columns
        if decoders and c not in schema.names and all(c in s.format.sample_columns for s in sources)
    )
    strings = [pa.field(c, pa.string()) for c in carried]
    # Each source's rows are checked by its own converter (a mixture's are cast after); where
    # the rows are the dataset's (one source), that converter converts them too.
    converters = [
        _converter(output, pa.schema([*s.plan.schema, *strings]), s.label) for s in sources
    ]
    checks = tuple(c.check for c in converters)
    packing = options.packing
    if packing is not None:  # a batch of tokens becomes sequences; nothing to decode
        packed = PackedConverter(
            packing.seq_len,
            packing.pad_value,
            output.format,
            method=packing.method,
            positions=packing.positions,
            static_shape=packing.static_shape,
            batch_size=options.batch_size,
            batch_tokens=options.batch_rows,
            source_key=source_key,
        )
        return Conversion(packed, checks, collate_fn, carried)
    whole = pa.schema([*schema, *strings])
    converter: Converts = (
        converters[0]
        if len(converters) == 1 and converters[0].schema.equals(whole)
        else _converter(output, whole, _label(sources))
    )
    collate = (
        Decoding(
            decoders,
            output_format=output.format,
            collate=collate_fn,
            on_error=options.on_error,
            carried=carried,
        )
        if decoders
        else collate_fn
    )
    return Conversion(converter, checks, collate, carried)


def _converter(output: Output, schema: pa.Schema, label: str) -> Converter:
    try:
        return output.converter(schema)
    except UnsupportedTypeError as exc:  # at planning: name the source
        raise UnsupportedTypeError(f"{label}: {exc}") from None


def _label(sources: Sequence[PlannedSource]) -> str:
    """The dataset's name in messages: its source's, or a mixture's."""
    return sources[0].label if len(sources) == 1 else f"a mixture of {len(sources)} sources"
