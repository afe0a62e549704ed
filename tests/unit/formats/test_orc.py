"""``OrcFormat``: stripe row counts parsed from the file tail (checked against pyarrow for every
codec), stripe chunks, row ranges, projection, regrouping and bad files."""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.orc as orc
import pytest

import torch_dataloader_utils as tdu
from tests.format_files import RecordingSpec, write_orc
from torch_dataloader_utils.errors import (
    ColumnNotFoundError,
    CorruptFileError,
    SchemaMismatchError,
    StorageNotFoundError,
)
from torch_dataloader_utils.formats import FormatPlan, Listing, ReadOptions, get_format
from torch_dataloader_utils.formats import orc as orc_module
from torch_dataloader_utils.formats.orc import OrcFormat, parse_stripes
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile, list_files

CODECS = ["uncompressed", "zlib", "snappy", "lz4", "zstd"]


def stripe_rows(path: Path) -> list[int]:
    handle = orc.ORCFile(str(path))
    return [handle.read_stripe(i).num_rows for i in range(handle.nstripes)]


def plan_of(
    paths: list[Path], options: ReadOptions | None = None, fs: FileSystemSpec | None = None
) -> tuple[FormatPlan, list[ListedFile], FileSystemSpec]:
    fs = fs or FileSystemSpec("file")
    files = list_files([str(p) for p in paths], fs)
    return OrcFormat().plan(Listing.of(files), fs, options or ReadOptions()), files, fs


def read_ids(fmt: OrcFormat, plan: FormatPlan, fs: FileSystemSpec, options: ReadOptions) -> list:
    out: list[int] = []
    for chunk in plan.chunks:
        for batch in fmt.read(chunk, 0, chunk.num_rows, fs, options):
            out.extend(batch.column("id").to_pylist())
    return out


# --- the tail ----------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", CODECS)
def test_stripe_rows_from_the_tail_equal_pyarrow(tmp_path: Path, compression: str) -> None:
    rng = np.random.default_rng(0)
    n = 60_000  # enough for several stripes under compression
    table = pa.table(
        {"id": np.arange(n), "v": rng.random(n), "s": [f"s{i % 977}" for i in range(n)]}
    )
    for stripe_size, batch in [(1, 7_000), (64 << 10, 1000), (64 << 20, 1000)]:
        path = tmp_path / f"{compression}-{stripe_size}.orc"
        orc.write_table(
            table, path, stripe_size=stripe_size, batch_size=batch, compression=compression
        )
        data = path.read_bytes()
        stripes = parse_stripes(data, len(data))
        assert [rows for rows, _ in stripes] == stripe_rows(path)
        assert sum(size for _, size in stripes) == orc.ORCFile(str(path)).content_length
    assert len(stripes) == 1  # the last: one big stripe


def test_stripes_of_an_empty_file(tmp_path: Path) -> None:
    path = write_orc(tmp_path / "empty.orc", np.arange(0))
    data = path.read_bytes()
    assert parse_stripes(data, len(data)) == []
    plan, files, fs = plan_of([path])
    assert plan.chunks == [] and "id" in plan.schema.names
    assert OrcFormat().schema(files[0], fs).names == plan.schema.names


def _blocks(payload: bytes, compress: object, *, size: int = 100) -> bytes:
    """``payload`` in ORC compression blocks of ``size`` bytes, alternately compressed and
    stored (``original``), each behind its 3-byte header."""
    out = bytearray()
    for k, at in enumerate(range(0, len(payload), size)):
        part = payload[at : at + size]
        body, original = (part, 1) if k % 3 == 2 else (compress(part), 0)  # type: ignore[operator]
        out += ((len(body) << 1) | original).to_bytes(3, "little") + body
    return bytes(out)


def _deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("kind", "compress"),
    [
        (orc_module._ZLIB, _deflate),
        (orc_module._SNAPPY, lambda b: pa.Codec("snappy").compress(b, asbytes=True)),
        (orc_module._LZ4, lambda b: pa.Codec("lz4_raw").compress(b, asbytes=True)),
        (orc_module._ZSTD, lambda b: pa.Codec("zstd").compress(b, asbytes=True)),
    ],
)
def test_compression_blocks_decode_exactly(kind: int, compress: object) -> None:
    # pyarrow's ORC writer stores small LZ4 footers uncompressed, so blocks are built here.
    payload = b"".join(f"stripe {i} of the footer;".encode() for i in range(40))
    assert orc_module._decompress(_blocks(payload, compress), kind, 256) == payload


def test_codecs_we_cannot_decode_are_told_apart_from_bad_bytes() -> None:
    with pytest.raises(orc_module._UnsupportedCodecError):
        orc_module._decompress(b"\x01\x00\x00x", orc_module._LZO, 256)
    no_size = b"\x28\xb5\x2f\xfd\x00\x58" + b"\0" * 8  # descriptor 0: no content size
    with pytest.raises(orc_module._UnsupportedCodecError):
        orc_module._zstd_size(no_size)
    with pytest.raises(ValueError, match="truncated"):
        orc_module._decompress(b"\x20\x00\x00abc", orc_module._ZLIB, 256)


def test_counting_by_reading_equals_the_tail(tmp_path: Path) -> None:
    """The fallback for codecs we cannot decode (LZO) counts what the tail says."""
    path = write_orc(tmp_path / "a.orc", np.arange(530), stripe_rows=64)
    handle = orc.ORCFile(str(path))
    data = path.read_bytes()
    counted = orc_module._count_by_reading(handle, handle.schema)
    assert counted == [rows for rows, _ in parse_stripes(data, len(data))]


def test_a_long_footer_is_read_in_a_second_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_orc(tmp_path / "a.orc", np.arange(600), stripe_rows=10)
    fs = RecordingSpec()
    plan, _, _ = plan_of([path], fs=fs)
    assert len(fs.calls) == 1  # the tail, in one request
    monkeypatch.setattr(orc_module, "_TAIL_BYTES", 64)  # shorter than the footer
    fs2 = RecordingSpec()
    plan2, _, _ = plan_of([path], fs=fs2)
    assert len(fs2.calls) == 2
    assert plan2.chunks == plan.chunks and len(plan.chunks) == 60


# --- planning and reading ----------------------------------------------------------------------


def test_chunks_are_stripes_with_exact_rows_and_sizes(tmp_path: Path) -> None:
    a = write_orc(tmp_path / "a.orc", np.arange(0, 250), stripe_rows=100)
    b = write_orc(tmp_path / "b.orc", np.arange(250, 300), stripe_rows=7)
    plan, _, fs = plan_of([a, b])
    assert [c.num_rows for c in plan.chunks] == stripe_rows(a) + stripe_rows(b)
    assert all(c.unit_rows == (c.num_rows,) and c.stop == c.start + 1 for c in plan.chunks)
    sizes = [s for p in (a, b) for _, s in parse_stripes(p.read_bytes(), p.stat().st_size)]
    assert [c.num_bytes for c in plan.chunks] == sizes
    assert plan.row_bytes >= 8 + 4 + 8 + 1  # at least the fixed-width columns
    assert read_ids(OrcFormat(), plan, fs, ReadOptions()) == list(range(300))


def test_rows_across_stripes_equal_pyarrow(tmp_path: Path) -> None:
    path = write_orc(tmp_path / "a.orc", np.arange(1000), stripe_rows=64)
    plan, _, fs = plan_of([path], ReadOptions(split_rows=1000))
    (chunk,) = plan.chunks
    assert chunk.unit_rows == tuple(stripe_rows(path))
    whole = orc.read_table(str(path))
    fmt = OrcFormat()
    for a, b in [(0, 1000), (63, 65), (64, 128), (100, 900), (999, 1000), (5, 5)]:
        got = pa.Table.from_batches(list(fmt.read(chunk, a, b, fs, ReadOptions())), plan.schema)
        assert got.equals(whole.slice(a, b - a)), (a, b)


@pytest.mark.parametrize(
    ("options", "rows"),
    [
        (ReadOptions(split_rows=150), [192, 192, 192, 192, 192, 40]),
        (ReadOptions(split_rows=1), [64] * 15 + [40]),
        (ReadOptions(split_rows=10_000), [1000]),
    ],
)
def test_regrouping_by_rows(tmp_path: Path, options: ReadOptions, rows: list[int]) -> None:
    path = write_orc(tmp_path / "a.orc", np.arange(1000), stripe_rows=64)
    plan, _, fs = plan_of([path], options)
    assert [c.num_rows for c in plan.chunks] == rows
    assert read_ids(OrcFormat(), plan, fs, options) == list(range(1000))
    again, _, _ = plan_of([path], options)
    assert again.chunks == plan.chunks  # deterministic


def test_regrouping_by_bytes(tmp_path: Path) -> None:
    path = write_orc(tmp_path / "a.orc", np.arange(1000), stripe_rows=64)
    one, _, _ = plan_of([path])
    stripe = one.chunks[0].num_bytes
    plan, _, fs = plan_of([path], ReadOptions(split_bytes=3 * stripe))
    assert len(plan.chunks) < len(one.chunks) and len(plan.chunks) > 1
    assert all(c.num_bytes >= 3 * stripe or c is plan.chunks[-1] for c in plan.chunks)
    assert read_ids(OrcFormat(), plan, fs, ReadOptions()) == list(range(1000))


def test_projection_keeps_the_requested_order(tmp_path: Path) -> None:
    path = write_orc(tmp_path / "a.orc", np.arange(300), stripe_rows=100)
    options = ReadOptions(columns=("name", "id"))
    plan, _, fs = plan_of([path], options)
    assert plan.schema.names == ["name", "id"]
    batches = list(OrcFormat().read(plan.chunks[1], 10, 20, fs, options))
    assert all(b.schema.equals(plan.schema) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("id").to_pylist() == list(range(110, 120))
    assert table.column("name").to_pylist() == [f"row-{i}" for i in range(110, 120)]


def test_no_columns_counts_every_stripe(tmp_path: Path) -> None:
    # The planner reads with columns=() to count rows (a projection of hive keys only, a
    # filter on them): liborc decodes no rows from an empty column list.
    path = write_orc(tmp_path / "a.orc", np.arange(250), stripe_rows=100)
    options = ReadOptions(columns=())
    plan, _, fs = plan_of([path], options)
    assert plan.schema.names == [] and [c.num_rows for c in plan.chunks] == [100, 100, 50]
    fmt = OrcFormat()
    for chunk in plan.chunks:
        for lo, hi in [(0, chunk.num_rows), (1, chunk.num_rows - 1)]:
            batches = list(fmt.read(chunk, lo, hi, fs, options))
            assert all(b.schema.names == [] for b in batches)
            assert sum(b.num_rows for b in batches) == hi - lo


def test_hive_keys_only_and_a_filter_on_them(tmp_path: Path) -> None:
    for k in (0, 1):
        write_orc(tmp_path / f"k={k}" / "a.orc", np.arange(k * 100, k * 100 + 100), stripe_rows=30)
    keys = tdu.StructuredDataset(
        str(tmp_path), format="orc", batch_size=10, partitioning="hive", columns=["k"]
    )
    assert Counter(k for b in keys for k in b["k"].tolist()) == {0: 100, 1: 100}
    only = tdu.StructuredDataset(
        str(tmp_path), format="orc", batch_size=10, partitioning="hive", filters=pc.field("k") == 1
    )
    assert sorted(i for b in only for i in b["id"].tolist()) == list(range(100, 200))


def test_a_missing_column_and_schema_drift(tmp_path: Path) -> None:
    a = write_orc(tmp_path / "a.orc", np.arange(10))
    with pytest.raises(ColumnNotFoundError, match="nope"):
        plan_of([a], ReadOptions(columns=("nope",)))
    b = tmp_path / "b.orc"
    orc.write_table(pa.table({"id": pa.array([1.5, 2.5])}), b)
    with pytest.raises(SchemaMismatchError, match=r"b\.orc.*a\.orc|a\.orc.*b\.orc"):
        plan_of([a, b], ReadOptions(columns=("id",)))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: b"", r"empty \(0 bytes\)"),
        (lambda data: data[: len(data) // 2], "not a readable ORC file"),
        (lambda data: data[:-4], "not a readable ORC file"),
        (lambda data: b"ORC" + bytes(range(256)) * 4, "not a readable ORC file"),
    ],
    ids=["zero-bytes", "half", "tail-cut", "garbage"],
)
def test_bad_files_are_corrupt_file_errors_naming_the_file(
    tmp_path: Path, damage: object, message: str
) -> None:
    good = write_orc(tmp_path / "good.orc", np.arange(500), stripe_rows=100)
    bad = tmp_path / "bad.orc"
    bad.write_bytes(damage(good.read_bytes()))  # type: ignore[operator]
    fs = FileSystemSpec("file")
    with pytest.raises(CorruptFileError, match=f"{bad}.*{message}|{message}.*{bad}"):
        plan_of([good, bad])
    file = ListedFile(str(bad), bad.stat().st_size, str(tmp_path))
    with pytest.raises(CorruptFileError, match=str(bad)):
        OrcFormat().schema(file, fs)


def test_a_file_that_shrank_after_planning_names_the_stripe(tmp_path: Path) -> None:
    path = write_orc(tmp_path / "a.orc", np.arange(500), stripe_rows=100)
    plan, _, fs = plan_of([path])
    write_orc(path, np.arange(50), stripe_rows=100)  # rewritten: one stripe of 50 rows
    with pytest.raises(CorruptFileError, match=rf"{path} stripe 0.*50 rows, the footer says 100"):
        list(OrcFormat().read(plan.chunks[0], 0, 100, fs, ReadOptions()))


def test_registry_and_pickling(tmp_path: Path) -> None:
    import pickle

    fmt = get_format("orc")
    assert isinstance(fmt, OrcFormat) and fmt.name == "orc"
    path = write_orc(tmp_path / "a.orc", np.arange(200), stripe_rows=100)
    plan, _, fs = plan_of([path])
    list(fmt.read(plan.chunks[0], 0, 10, fs, ReadOptions()))  # opens a file
    assert fmt._open
    clone = pickle.loads(pickle.dumps(fmt))
    assert not clone._open  # open files stay behind
    assert read_ids(clone, plan, fs, ReadOptions()) == list(range(200))


def test_a_file_deleted_after_listing_is_a_storage_error(tmp_path: Path) -> None:
    path = write_orc(tmp_path / "a.orc", np.arange(200), stripe_rows=100)
    plan, files, _ = plan_of([path])
    path.unlink()
    with pytest.raises(StorageNotFoundError, match=str(path)):  # the tail's range read
        OrcFormat().plan(Listing.of(files), FileSystemSpec("file"), ReadOptions())
    with pytest.raises(StorageNotFoundError, match=str(path)):
        list(OrcFormat().read(plan.chunks[1], 0, 100, FileSystemSpec("file"), ReadOptions()))
