"""Arrow → torch / numpy / dict: the only place tensors are made.

Every column's conversion is decided once, from the schema, before any worker starts (types
that cannot be read at all are refused earlier, at planning: `formats.schemas.check_readable`).
Per batch the work is vectorised: no per-row Python except for columns that become Python
lists. The full table of types is docs/reference/types.md.

Mapping (``output_format="torch"``; ``"numpy"`` gives the same shapes as numpy arrays):

==============================  ===========================================================
Arrow type                      output
==============================  ===========================================================
int*/uint*/float*               1-D tensor of the same dtype (zero-copy when possible)
bool                            1-D ``torch.bool`` tensor
timestamp/date/time/duration    1-D int tensor of the stored values (int64, date32 → int32)
fixed_size_list<numeric>        2-D tensor ``[rows, size]``
list<numeric>                   ``list_format``: ``"padded"`` (default) → ``col`` ``[rows,
                                longest]`` padded with ``pad_value`` plus ``col_lengths``;
                                ``"offsets"`` → ``col`` (all values) plus ``col_offsets``
                                (``rows + 1``); ``"nested"`` → a jagged nested tensor
null                            Python list of ``None``
string/binary/other             Python list (temporal values inside nested types as their
                                stored integers; extension values as pyarrow gives them)
==============================  ===========================================================

Nulls never change a dtype: ``null_policy="error"`` (default) raises `NullValueError`
naming the column; ``"fill"`` fills numeric nulls with NaN (floats), 0 (ints) or False (a
null list is an empty one, a null value in a list is filled the same way); ``"mask"`` fills
the same way and adds a boolean ``col_valid`` (and, for list columns, ``col_values_valid``
shaped like ``col``).

- `rules`: a schema's batches converted to the output format, and the reader's checks
  (`Converter`, `Problem`);
- `columns`: each column's rule by its type, decided from the schema (`ColumnRules`);
- `fields`: a converted column before it becomes a tensor (`Field`, `Gather`), a batch
  whose arrays one call writes (`Planned`, `copied`, `each_written`);
- `parts`: gathering from a shuffle block left in parts (`BlockParts`, `Picks`, `GatherParts`);
- `stacks`: small batches' numeric columns, one gather per type (`Stacks`);
- `last_block`: what is derived once per block, for every batch cut from it (`LastBlock`);
- `decoders`: a format's per-value decoders, applied and stacked (`Decoding`);
- `output`: the options of a dataset's conversion (`Output`).
"""

from .decoders import Decoding
from .fields import IN_PLACE, Field, Gather, Planned, as_numpy, as_tensor, copied, each_written
from .lists import ListRows
from .output import Output
from .parts import GatherParts, Picks
from .rules import (
    LIST_FORMATS,
    NULL_POLICIES,
    OUTPUT_FORMATS,
    Converter,
    ListFormat,
    NullPolicy,
    OutputFormat,
    Problem,
)

__all__ = [
    "IN_PLACE",
    "LIST_FORMATS",
    "NULL_POLICIES",
    "OUTPUT_FORMATS",
    "Converter",
    "Decoding",
    "Field",
    "Gather",
    "GatherParts",
    "ListFormat",
    "ListRows",
    "NullPolicy",
    "Output",
    "OutputFormat",
    "Picks",
    "Planned",
    "Problem",
    "as_numpy",
    "as_tensor",
    "copied",
    "each_written",
]
