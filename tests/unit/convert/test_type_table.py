"""docs/reference/types.md is what users get: each row of its table is checked here.

For every row (an Arrow type) a one-column IPC file of that type is read through
`create_dataloader` with each output format, and what comes back is described the way the
table's cells are written (``tensor[int64]``, ``list[Decimal]``, ``refused``); the doc's
cell must be that description. A type missing from the doc, or a cell that differs, fails.
"""

from __future__ import annotations

import datetime
import decimal
import re
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from pyarrow import ipc

import torch_dataloader_utils as tdu
from tests.corpus.cases import ROOT

DOC = Path(__file__).resolve().parents[3] / "docs" / "reference" / "types.md"
OUTPUTS = ("torch", "numpy", "dict", "arrow")


def _values() -> dict[str, pa.Array]:
    """One column per documented type: its name in the doc's first column → 3 values."""
    ts = pa.array([0, 1_700_000_000_000_000, 86_400_000_000], pa.timestamp("us"))
    strings = pa.array(["a", "bb", "ccc"])
    return {
        "int64": pa.array([1, 2, 3], pa.int64()),
        "float16": pa.array(np.array([1, 2, 3], np.float16)),
        "float32": pa.array([1.5, 2.5, 3.5], pa.float32()),
        "bool": pa.array([True, False, True]),
        "decimal128(5, 2)": pa.array(
            [decimal.Decimal("1.25"), decimal.Decimal("2.50"), decimal.Decimal("3.75")],
            pa.decimal128(5, 2),
        ),
        "date32": pa.array([0, 1, 19000], pa.date32()),
        "date64": pa.array([0, 86_400_000, 172_800_000], pa.date64()),
        "time64[us]": pa.array([0, 1, 2], pa.time64("us")),
        "timestamp[us]": ts,
        "duration[ms]": pa.array([0, 1, 2], pa.duration("ms")),
        "month_day_nano_interval": pa.array(
            [pa.MonthDayNano([1, 2, 3])] * 3, pa.month_day_nano_interval()
        ),
        "month_interval": pa.nulls(0),  # see _FILES
        "null": pa.nulls(3),
        "string": strings,
        "string_view": strings.cast(pa.string_view()),
        "binary": pa.array([b"a", b"bb", b"ccc"]),
        "binary_view": pa.array([b"a", b"bb", b"ccc"], pa.binary_view()),
        "list<int32>": pa.array([[1], [2, 3], []], pa.list_(pa.int32())),
        "fixed_size_list<float, 2>": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.float32(), 2)),
        "list<string>": pa.array([["a"], [], ["b", "c"]]),
        "list_view<int32>": pa.array([[1], [2, 3], []], pa.list_view(pa.int32())),
        "struct": pa.array([{"a": 1, "t": 0}, {"a": 2, "t": 1}, {"a": 3, "t": 2}]),
        "struct<t: timestamp[us]>": pa.StructArray.from_arrays([ts], names=["t"]),
        "map<string, int64>": pa.array(
            [[("k", 1)], [], [("a", 2)]], pa.map_(pa.string(), pa.int64())
        ),
        "dictionary<string>": strings.dictionary_encode(),
        "dictionary<int64>": pa.array([1, 2, 1]).dictionary_encode(),
        "run_end_encoded<int32>": pc.run_end_encode(pa.array([1, 1, 2], pa.int32())),
        "sparse_union<int64, string>": pa.UnionArray.from_sparse(
            pa.array([0, 1, 0], pa.int8()), [pa.array([1, 2, 3]), pa.array(["x", "y", "z"])]
        ),
        "extension<arrow.uuid>": pa.ExtensionArray.from_storage(
            pa.uuid(), pa.array([uuid.uuid4().bytes for _ in range(3)], pa.binary(16))
        ),
        "extension<arrow.json>": pa.ExtensionArray.from_storage(
            pa.json_(), pa.array(['{"a": 1}', "[]", "null"])
        ),
        "timestamp[ns, tz=Europe/Paris]": pa.array([0, 1, 2], pa.timestamp("ns", "Europe/Paris")),
        "time32[ms]": pa.array([0, 1, 2], pa.time32("ms")),
        "decimal256(40, 2)": pa.array(
            [decimal.Decimal("1.25"), decimal.Decimal("-2.50"), decimal.Decimal("3")],
            pa.decimal256(40, 2),
        ),
        "large_string": strings.cast(pa.large_string()),
        "fixed_size_binary(2)": pa.array([b"ab", b"cd", b"ef"], pa.binary(2)),
        "large_list<float64>": pa.array([[1.0], [], [2.0, 3.0]], pa.large_list(pa.float64())),
        "list<list<int32>>": pa.array([[[1]], [], [[2, 3], []]], pa.list_(pa.list_(pa.int32()))),
        "dense_union<int64, string>": pa.UnionArray.from_dense(
            pa.array([0, 1, 0], pa.int8()),
            pa.array([0, 0, 1], pa.int32()),
            [pa.array([1, 2]), pa.array(["x"])],
        ),
        "extension<geoarrow.wkb>": pa.ExtensionArray.from_storage(
            _Wkb(), pa.array([b"\x01\x01\x00\x00\x00" + bytes(16)] * 3)
        ),
    }


class _Wkb(pa.ExtensionType):
    """A geospatial extension type as GeoArrow writes it (WKB in binary storage)."""

    def __init__(self) -> None:
        super().__init__(pa.binary(), "geoarrow.wkb")

    def __arrow_ext_serialize__(self) -> bytes:
        return b"{}"

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _Wkb:
        return cls()


pa.register_extension_type(_Wkb())


# Doc rows whose type pyarrow cannot build in Python: a real file of the corpus holds it.
_FILES = {
    "month_interval": ROOT
    / "arrow-testing/data/arrow-ipc-stream/integration/cpp-21.0.0/generated_interval.arrow_file",
}


def describe(value: Any, output: str, column: pa.Array) -> str:
    """What ``value`` (a column of one batch) is, written as the doc's cells are."""
    if output == "arrow":
        return "same type" if value.type == column.type else f"Arrow {value.type}"
    if isinstance(value, torch.Tensor):
        kind = "nested tensor" if value.is_nested else "tensor"
        dims = f", {value.dim()}-D" if value.dim() != 1 and not value.is_nested else ""
        return f"{kind}[{str(value.dtype).removeprefix('torch.')}{dims}]"
    if isinstance(value, np.ndarray):
        dims = f", {value.ndim}-D" if value.ndim != 1 else ""
        return f"ndarray[{value.dtype}{dims}]"
    assert isinstance(value, list), type(value)
    kinds = {_python_kind(v) for v in value if v is not None}
    return f"list[{' or '.join(sorted(kinds)) or 'None'}]"


def _python_kind(v: Any) -> str:
    for kind in (bool, int, float, str, bytes, decimal.Decimal, dict, list, tuple, uuid.UUID):
        if isinstance(v, kind):
            return kind.__name__
    for kind in (datetime.datetime, datetime.date, datetime.time, datetime.timedelta):
        if isinstance(v, kind):
            return kind.__name__
    return type(v).__name__


def observe(column: pa.Array, output: str, tmp: Path, path: Path | None = None) -> str:
    """Read a one-column file of ``column`` (or the file ``path``) with ``output``; the doc
    cell it gives."""
    if path is None:
        path = tmp / f"{output}.arrow"
        with ipc.new_file(str(path), pa.schema([("c", column.type)])) as writer:
            writer.write_batch(pa.record_batch([column], names=["c"]))
    try:
        loader = tdu.create_dataloader(
            str(path), format="ipc", output_format=output, num_workers=0, batch_size=3
        )
    except tdu.UnsupportedTypeError:
        return "refused"
    (batch,) = list(loader)
    value = batch.column("c") if output == "arrow" else batch["c"]
    return describe(value, output, column)


def doc_table() -> dict[str, dict[str, str]]:
    """The doc's table: type → output → the cell's code span (its first one)."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in DOC.read_text().splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        code = [re.search(r"`([^`]*)`", c) for c in cells]
        name = code[0][1] if code[0] else cells[0]
        rows[name] = {
            header[i]: (code[i][1] if code[i] else cells[i]) for i in range(1, len(cells))
        }
    return rows


@pytest.mark.parametrize("name", sorted(_values()))
def test_doc_row_is_what_users_get(name: str, tmp_path: Path) -> None:
    table = doc_table()
    assert name in table, f"docs/reference/types.md has no row for `{name}`"
    column = _values()[name]
    got = {output: observe(column, output, tmp_path, _FILES.get(name)) for output in OUTPUTS}
    assert {o: table[name][o] for o in OUTPUTS} == got, name


def test_every_doc_row_is_checked() -> None:
    assert set(doc_table()) == set(_values())
