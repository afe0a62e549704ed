"""States saved by earlier versions resume now that a plan's schema has one form on every path:
a plan without fixed-size lists or maps fingerprints as before, and a plan with them accepts
what one process (Parquet's names) and N ranks (pickle's names) fingerprinted before."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.errors import StateMismatchError
from torch_dataloader_utils.planning import Chunk, Layout, Plan
from torch_dataloader_utils.state import Pass, decode_state, encode_state

CHUNKS = [
    Chunk("/data/a/part-0.parquet", 0, 2, 30, 100, (10, 20)),
    Chunk("/data/a/part-1.parquet", 0, 1, 5, 10, (5,)),
]
LAYOUT = Layout(
    batch_size=4,
    shuffle=True,
    seed=7,
    drop_last=False,
    remainder="drop",
    block_rows=64,
    first_block_rows=8,
)
PARQUET = Plan.details_of(format="parquet")

ORDINARY = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("l", pa.list_(pa.field("element", pa.int32(), False, {"PARQUET:field_id": "7"}))),
        pa.field(
            "s",
            pa.struct(
                [
                    pa.field("t", pa.timestamp("ms", "UTC"), False),
                    pa.field("d", pa.decimal128(9, 2)),
                ]
            ),
        ),
        pa.field("d", pa.dictionary(pa.int32(), pa.string())),
        pa.field("ll", pa.large_list(pa.string())),
    ]
)


def _nested() -> pa.Schema:
    """The schema one process planned from a Parquet file with fixed-size lists and maps, at
    depth (a fixed-size list's child ``element``, each map's entries named after its field)."""
    fsl, mp = pa.list_(pa.int32(), 2), pa.map_(pa.string(), pa.int64())
    table = pa.table(
        {
            "id": pa.array([1]),
            "fsl": pa.array([[1, 2]], fsl),
            "m": pa.array([[("a", 1)]], mp),
            "s": pa.array([{"f": [1, 2], "m": [("k", 1)]}], pa.struct([("f", fsl), ("m", mp)])),
            "lm": pa.array([[[("k", [[1, 2]])]]], pa.list_(pa.map_(pa.string(), pa.list_(fsl)))),
        }
    )
    file = io.BytesIO()
    pq.write_table(table, file)
    file.seek(0)
    return pq.read_schema(file).remove_metadata()


def _resumes(plan: Plan, fingerprint: str) -> bool:
    state = encode_state(
        plan, Pass(0, (), 3), world_size=1, num_workers=0, layout=LAYOUT, complete=False
    )
    state = json.loads(json.dumps(state))
    state["plan"]["fingerprint"] = fingerprint
    try:
        decoded = decode_state(state, plan, world_size=1, num_workers=0, layout=LAYOUT)
    except StateMismatchError:
        return False
    return decoded.batches == 3


def test_the_fingerprint_of_a_plan_without_fixed_size_lists_or_maps_is_unchanged() -> None:
    # Printed by the code before plans had a portable schema (the columnar and the chunk by
    # chunk fingerprint): states saved by it carry them.
    plan = Plan(chunks=CHUNKS, schema=ORDINARY, row_bytes=8.0, details=PARQUET)
    assert plan.schema is ORDINARY
    assert plan.fingerprint == "4eaeec06287c82bf"
    assert plan.legacy_fingerprint() == "5c6d7d74341d41d8"


@pytest.mark.parametrize(
    ("saved_by", "fingerprint"),
    [
        ("one process", "36fbd5875ff849de"),
        ("one process, chunk by chunk", "15c52afa8b726a41"),
        ("N ranks", "6fbefa56d509947b"),
        ("N ranks, chunk by chunk", "63c29cf2591c91da"),
    ],
)
def test_a_state_an_earlier_version_saved_over_nested_types_resumes(
    saved_by: str, fingerprint: str
) -> None:
    # Printed by the code before plans had a portable schema, for this plan planned in one
    # process (Parquet's child names) and on N ranks (the schema pickled).
    plan = Plan(chunks=CHUNKS, schema=_nested(), row_bytes=8.0, details=PARQUET)
    assert _resumes(plan, fingerprint), saved_by
    assert not _resumes(plan, "0123456789abcdef")
    # Another plan of the same schema does not take them.
    other = Plan(chunks=CHUNKS[:1], schema=_nested(), row_bytes=8.0, details=PARQUET)
    assert not _resumes(other, fingerprint)
