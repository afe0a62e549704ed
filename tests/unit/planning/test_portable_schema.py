"""One plan on every planning path, for every Arrow type the formats yield.

pyarrow's pickling names a fixed-size list's child ``item`` and a map's entries ``entries``;
Arrow IPC renames a map's entries and fields too. A plan is made in one process from a file's
own schema, on N ranks from facts that crossed processes by pickle, from facts or a plan kept
in ``cache_dir`` (pickled to disk), and is pickled into DataLoader and Ray workers. Property:
over generated types (nested at any depth), real Parquet and Arrow IPC files of that type plan
to the same fingerprint and the same schema (to the child's name) on every path, and that
schema comes back unchanged through pickle and IPC.
"""

from __future__ import annotations

import contextlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.formats import Listing, ReadOptions, get_format
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile
from torch_dataloader_utils.planning import Plan
from torch_dataloader_utils.sources.files import Planned
from torch_dataloader_utils.sources.kept import Kept, KeptPlans

# (hypothesis warns that the repr of the nested type strategy is large)
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

ROWS = 3
METADATA = {"PARQUET:field_id": "7"}

LEAVES = [
    pa.int8(),
    pa.int64(),
    pa.uint16(),
    pa.float16(),
    pa.float64(),
    pa.bool_(),
    pa.string(),
    pa.large_string(),
    pa.string_view(),
    pa.binary(),
    pa.binary(3),
    pa.date32(),
    pa.time64("us"),
    pa.duration("ms"),
    pa.decimal32(5, 2),
    pa.decimal64(12, 3),
    pa.decimal128(20, 4),
    pa.decimal256(40, 5),
    pa.dictionary(pa.int32(), pa.string()),
    *(pa.timestamp(u, tz) for u in ("s", "us", "ns") for tz in (None, "UTC", "Europe/Paris")),
    pa.timestamp("ms", "+05:30"),
    pa.fixed_shape_tensor(pa.float32(), [2, 2]),  # (an extension type over a fixed-size list)
    pa.uuid(),
]


def _child(inner: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[pa.Field]:
    """A child field as writers name them (``element``, ``item``, other), maybe not nullable,
    maybe with a Parquet field id."""
    return st.builds(
        pa.field,
        st.sampled_from(["element", "item", "x"]),
        inner,
        st.booleans(),
        st.sampled_from([None, METADATA]),
    )


def _struct(children: list[tuple[pa.DataType, bool]]) -> pa.DataType:
    return pa.struct([pa.field(f"f{i}", t, nullable) for i, (t, nullable) in enumerate(children)])


def _nested(inner: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[pa.DataType]:
    key = st.builds(
        pa.field,
        st.sampled_from(["key", "k"]),
        st.sampled_from([pa.string(), pa.int32()]),
        st.just(False),
        st.sampled_from([None, METADATA]),
    )
    value = st.builds(
        pa.field, st.sampled_from(["value", "v"]), inner, st.booleans(), st.just(None)
    )
    return st.one_of(
        _child(inner).map(pa.list_),
        _child(inner).map(pa.large_list),
        # (list views of one leaf column: the Parquet footer check counts a list view as one
        # leaf column, whatever it holds, and refuses the file)
        _child(st.sampled_from(LEAVES)).map(pa.list_view),
        st.builds(pa.list_, _child(inner), st.integers(1, 3)),  # a fixed-size list
        st.builds(pa.map_, key, value, st.booleans()),
        st.lists(st.tuples(inner, st.booleans()), min_size=1, max_size=3).map(_struct),
        inner.map(lambda t: pa.run_end_encoded(pa.int32(), t)),
        inner.map(lambda t: pa.dense_union([pa.field("u", t), pa.field("w", pa.int8())])),
    )


TYPES = st.recursive(st.sampled_from(LEAVES), _nested, max_leaves=6)


def _ipc(schema: pa.Schema) -> pa.Schema:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    return pa.ipc.open_stream(sink.getvalue()).schema


def _text(schema: pa.Schema) -> str:
    """Everything the fingerprint and the converters see of a schema, child names included."""
    return schema.to_string(show_schema_metadata=False)


def _write(
    root: Path, name: str, schema: pa.Schema, table: pa.Table | None
) -> list[ListedFile] | None:
    """Two files in format ``name`` of ``table`` (no rows where None or where the format refuses
    its nulls), or None where the format cannot store the type."""
    paths = [root / f"{name}-{i}.{name}" for i in range(2)]
    try:
        for path in paths:
            _write_one(path, name, schema, table)
    except pa.ArrowNotImplementedError:
        return None
    return [ListedFile(str(p), p.stat().st_size, "") for p in paths]


def _write_one(path: Path, name: str, schema: pa.Schema, table: pa.Table | None) -> None:
    try:
        if name == "parquet":
            with pq.ParquetWriter(path, schema) as parquet:
                if table is not None:
                    parquet.write_table(table)
        else:
            with pa.ipc.new_file(path, schema) as ipc:
                if table is not None:
                    ipc.write_table(table)
    except pa.ArrowInvalid:  # (nulls under a non-nullable child)
        _write_one(path, name, schema, None)


def _plan(fmt: Any, planned: Any) -> Plan:
    return Plan(
        chunks=planned.chunks,
        schema=planned.schema,
        row_bytes=planned.row_bytes,
        details=Plan.details_of(format=fmt.name),
    )


def _paths(fmt: Any, files: list[ListedFile], cache: Path) -> dict[str, Plan]:
    """The plan of ``files`` along every path planning takes."""
    fs, options = FileSystemSpec("file"), ReadOptions()
    listing = Listing.of(files)
    one = _plan(fmt, fmt.plan(listing, fs, options))
    facts = fmt.facts(listing, fs, options)
    gathered = pickle.loads(pickle.dumps(facts))  # `Spread.share`'s gather
    mixed = [gathered[0], facts[1]]  # one file's facts kept from a run, the other read now
    kept = KeptPlans(str(cache), fmt.name)
    kept.save(Kept("listing", Planned(options, one, None, 1.0)))
    loaded = kept.load()
    assert loaded is not None
    native = fmt.schema(files[0], fs)  # the file's own schema, as the format reads it
    return {
        "one process": one,
        "N ranks": _plan(fmt, fmt.assemble(listing, gathered, fs, options)),
        "kept facts": _plan(fmt, fmt.assemble(listing, mixed, fs, options)),
        "kept plan": loaded.planned.plan,
        "pickled into a worker": pickle.loads(pickle.dumps(one)),
        "schema pickled": Plan(
            chunks=one.chunks,
            schema=pickle.loads(pickle.dumps(native)),
            row_bytes=one.row_bytes,
            details=one.details,
        ),
        "schema through IPC": Plan(
            chunks=one.chunks, schema=_ipc(native), row_bytes=one.row_bytes, details=one.details
        ),
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("one-plan")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=TYPES)
def test_every_path_plans_one_fingerprint_and_one_schema(t: pa.DataType, cache: Path) -> None:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("c", t)])
    table: pa.Table | None = None
    # (pyarrow makes no nulls of some unions: files with a schema and no rows)
    with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
        table = pa.table([pa.array(np.arange(ROWS)), pa.nulls(ROWS, t)], schema=schema)
    root = cache / "files"
    root.mkdir(exist_ok=True)
    for name in ("parquet", "ipc"):
        files = _write(root, name, schema, table)
        if files is None:
            continue  # (Parquet stores neither unions nor run-end encoding: IPC does)
        plans = _paths(get_format(name), files, cache)
        fingerprints = {path: p.fingerprint for path, p in plans.items()}
        schemas = {path: _text(p.schema) for path, p in plans.items()}
        assert len(set(fingerprints.values())) == 1, (name, t, fingerprints)
        assert len(set(schemas.values())) == 1, (name, t, schemas)
        planned = plans["one process"].schema
        assert _text(pickle.loads(pickle.dumps(planned))) == _text(planned), (name, t)
        assert _text(_ipc(planned)) == _text(planned), (name, t)
