"""The columnar plan: chunks and file identities as arrays, the same `Chunk` values out, one
shared buffer for processes started by multiprocessing, fingerprints old states still match."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import pickle
import posixpath
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pyarrow as pa
import pytest
import torch.multiprocessing  # noqa: F401 - torch's shared-memory reductions for ForkingPickler

from torch_dataloader_utils.planning import Chunk, Chunks, Files, Plan
from torch_dataloader_utils.planning import plan as plan_module

CHUNKS = [
    Chunk("/data/a/part-0.parquet", 0, 2, 30, 100, (10, 20)),
    Chunk("/data/a/part-0.parquet", 2, 3, 5, 10, (5,)),
    Chunk("/data/b/é x.csv", 0, 900, 7, 900, (), (("day", "2024-01-01"),)),
    Chunk("/data/b/empty.csv", 0, 0, 0, 0),
    Chunk("s3-key/with\udcffsurrogate", 5, 6, 2**40, 2**33, (2**40,), (("n", None),)),
]
FILES = {"/data/a/part-0.parquet": (110, "mtime=1"), "/data/b/é x.csv": (900, 'etag="x"')}
SCHEMA = pa.schema([("id", pa.int64())])


def test_chunks_give_back_the_same_chunk_values() -> None:
    chunks = Chunks.of(CHUNKS)
    assert len(chunks) == len(CHUNKS)
    assert list(chunks) == CHUNKS
    assert [chunks[i] for i in range(-len(CHUNKS), 0)] == CHUNKS
    assert chunks == CHUNKS and chunks == Chunks.of(CHUNKS)
    assert list(chunks[1:4]) == CHUNKS[1:4]
    assert chunks.paths == list(dict.fromkeys(c.path for c in CHUNKS))
    assert chunks.num_rows.tolist() == [c.num_rows for c in CHUNKS]
    with pytest.raises(IndexError):
        chunks[len(CHUNKS)]
    assert list(Chunks.of([])) == []


def test_columns_are_read_only() -> None:
    chunks = Chunks.of(CHUNKS)
    with pytest.raises(ValueError):
        chunks.num_rows[0] = 1
    plan = Plan(chunks=CHUNKS, schema=SCHEMA, row_bytes=8.0, filtered_rows=(3, 5, 0, 0, 1))
    with pytest.raises(ValueError):
        plan.chunk_rows[0] = 9


def test_built_from_arrays_equals_built_from_objects() -> None:
    n = 1000
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 500, n)
    from_arrays = Chunks.from_arrays(
        paths=[f"/d/f{i}.parquet" for i in range(n // 10)],
        file=np.arange(n) // 10,
        start=np.arange(n) % 10,
        stop=np.arange(n) % 10 + 1,
        num_rows=rows,
        num_bytes=rows * 8,
        unit_offsets=np.arange(n + 1),
        unit_rows=rows,
    )
    objects = [
        Chunk(f"/d/f{i // 10}.parquet", i % 10, i % 10 + 1, int(r), int(r) * 8, (int(r),))
        for i, r in enumerate(rows)
    ]
    assert from_arrays == Chunks.of(objects)
    assert list(from_arrays) == objects
    plan_a = Plan(chunks=from_arrays, schema=SCHEMA, row_bytes=8.0)
    plan_b = Plan(chunks=tuple(objects), schema=SCHEMA, row_bytes=8.0)
    assert plan_a.fingerprint == plan_b.fingerprint and plan_a == plan_b


def test_two_chunks_with_two_units_each_are_read_per_chunk() -> None:
    # Two chunks' unit lists once looked like an (offsets, values) pair: the flat form now has
    # its own keyword.
    per_chunk = Chunks.from_arrays(
        paths=["/d/a.parquet"],
        file=np.zeros(2, np.int64),
        start=np.array([0, 2]),
        stop=np.array([2, 4]),
        num_rows=np.array([7, 9]),
        num_bytes=np.array([70, 90]),
        unit_rows=(np.array([3, 4]), np.array([4, 5])),
    )
    flat = Chunks.from_arrays(
        paths=["/d/a.parquet"],
        file=np.zeros(2, np.int64),
        start=np.array([0, 2]),
        stop=np.array([2, 4]),
        num_rows=np.array([7, 9]),
        num_bytes=np.array([70, 90]),
        unit_offsets=np.array([0, 2, 4]),
        unit_rows=np.array([3, 4, 4, 5]),
    )
    assert [c.unit_rows for c in per_chunk] == [(3, 4), (4, 5)]
    assert per_chunk == flat
    with pytest.raises(ValueError, match="unit_offsets"):
        Chunks.from_arrays(
            paths=["/d/a.parquet"],
            file=np.zeros(2, np.int64),
            start=np.array([0, 2]),
            stop=np.array([2, 4]),
            num_rows=np.array([7, 9]),
            num_bytes=np.array([70, 90]),
            unit_offsets=np.array([0, 4]),
            unit_rows=np.array([3, 4, 4, 5]),
        )


def test_pickle_round_trips_plans() -> None:
    plan = Plan(chunks=CHUNKS, schema=SCHEMA, row_bytes=8.0, files=FILES, filtered_rows=None)
    again = pickle.loads(pickle.dumps(plan))
    assert list(again.chunks) == CHUNKS
    assert dict(again.files) == FILES
    assert again.fingerprint == plan.fingerprint and again.files_digest == plan.files_digest
    assert again.chunk_rows.tolist() == plan.chunk_rows.tolist()


def test_files_is_the_mapping_it_was_built_from() -> None:
    files = Files.of(FILES)
    assert dict(files) == FILES and len(files) == 2
    assert files["/data/b/é x.csv"] == (900, 'etag="x"')
    assert files.get("/nowhere") is None
    assert dict(Files.of({})) == {}


def _rows_in(chunks: Chunks, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put([(c.path, c.start, c.stop, c.num_rows, c.unit_rows, c.partition) for c in chunks])


def test_a_spawned_process_gets_a_handle_not_the_bytes() -> None:
    n = 100_000
    chunks = Chunks.from_arrays(
        paths=[f"/data/part-{i:06d}.parquet" for i in range(n // 10)],
        file=np.arange(n) // 10,
        start=np.arange(n) % 10,
        stop=np.arange(n) % 10 + 1,
        num_rows=np.random.default_rng(0).integers(1, 30_000, n),
        num_bytes=np.full(n, 800),
    )
    assert len(pickle.dumps(chunks)) > 100_000  # the bytes, for pickle and torch.distributed
    assert len(ForkingPickler.dumps(chunks)) < 10_000  # a shared-memory handle
    small = Chunks.of(CHUNKS)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_rows_in, args=(small, queue))
    child.start()
    got = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert got == [(c.path, c.start, c.stop, c.num_rows, c.unit_rows, c.partition) for c in CHUNKS]


def test_legacy_fingerprints_are_those_earlier_versions_computed() -> None:
    # Values printed by the code before the columnar plan (commit 1992cd4) for these plans:
    # states saved by it carry them.
    plan = Plan(
        chunks=CHUNKS[:4],
        schema=SCHEMA,
        row_bytes=8.0,
        details=Plan.details_of(format="parquet"),
        files=FILES,
    )
    assert plan.legacy_fingerprint() == "96cb7209095901e4"
    assert plan.files_digest == "776f3d400a4bd13c"  # unchanged algorithm
    filtered = Plan(chunks=CHUNKS[:4], schema=SCHEMA, row_bytes=8.0, filtered_rows=(3, 5, 0, 0))
    assert filtered.legacy_fingerprint() == "b96f1afadc292b1a"
    assert plan.fingerprint != plan.legacy_fingerprint()  # the new one is vectorised


def test_fingerprint_changes_with_any_chunk_field() -> None:
    base = Plan(chunks=CHUNKS, schema=SCHEMA, row_bytes=8.0).fingerprint
    changed = [dataclasses.replace(c, num_rows=c.num_rows + (i == 2)) for i, c in enumerate(CHUNKS)]
    assert Plan(chunks=changed, schema=SCHEMA, row_bytes=8.0).fingerprint != base
    moved = [dataclasses.replace(c, path="/elsewhere" + c.path) for c in CHUNKS[:3]]
    assert (
        Plan(chunks=moved, schema=SCHEMA, row_bytes=8.0).fingerprint
        == Plan(chunks=CHUNKS[:3], schema=SCHEMA, row_bytes=8.0).fingerprint
    )  # paths relative to their common folder: data moved elsewhere still resumes
    units = [dataclasses.replace(c, unit_rows=()) for c in CHUNKS]
    assert Plan(chunks=units, schema=SCHEMA, row_bytes=8.0).fingerprint != base


@pytest.mark.parametrize(
    "paths",
    [
        ["/a/b/c.parquet", "/a/b/d/e.parquet"],
        ["/x.parquet", "/y/z.parquet"],
        ["a/b.csv", "a/c/d.csv"],
        ["/a/b.parquet"],
        ["bucket/k/x", "bucket/k/y"],
        ["/a/./b", "/a/c"],
        ["rel/x", "/abs/y"],
        ["/a/b/é x", "/a/b/é y"],
    ],
)
def test_relative_names_are_what_relpath_gives(paths: list[str]) -> None:
    root = plan_module._common_folder(paths)
    expected = [posixpath.relpath(p, root) for p in paths] if root else paths
    assert plan_module._relative(paths) == expected


@pytest.mark.parametrize(
    "files",
    [
        FILES,
        {  # names and versions JSON escapes: quotes, backslashes, control and non-ASCII
            '/d/q"uote/a\\b.parquet': (1, 'etag="\\x"'),
            "/d/tab\there/ü€😀.parquet": (2**40, "mtime=1.5\n"),
            "/d/plain.parquet": (0, ""),
        },
        {f"/data/{i % 7}/part-{i:05d}.parquet": (i, f"mtime={i}.25") for i in range(500)},
    ],
    ids=["two", "escaped", "many"],
)
def test_the_files_digest_is_the_json_records_earlier_versions_hashed(files: dict) -> None:
    """States saved before carry the files' digest as a JSON array a file, `json.dumps`'s
    bytes, hashed in sorted order: the digest, written in one pass now, is the same."""
    plan = Plan(chunks=CHUNKS[:1], schema=SCHEMA, row_bytes=8.0, files=files)
    ordered = sorted(files.items())
    names = plan_module._relative([path for path, _ in ordered])
    earlier = hashlib.sha256()
    for name, (_, (size, version)) in zip(names, ordered, strict=True):
        earlier.update(json.dumps([name, size, version]).encode())
    assert plan.files_digest == earlier.hexdigest()[:16]
