"""``IpcFormat``: record-batch chunks of IPC files and streams, planned from message headers
only (checked against pyarrow), row ranges, projection, regrouping and bad files."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest

from tests.format_files import RecordingSpec, ipc_table, write_ipc
from torch_dataloader_utils.errors import (
    ColumnNotFoundError,
    CorruptFileError,
    SchemaMismatchError,
    StorageNotFoundError,
)
from torch_dataloader_utils.formats import FormatPlan, Listing, ReadOptions, get_format
from torch_dataloader_utils.formats.ipc import IpcFormat
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile, list_files


def batch_rows(path: Path) -> list[int]:
    """Rows of each record batch, decoded by pyarrow."""
    with pa.memory_map(str(path)) as source:
        if path.read_bytes()[:6] == b"ARROW1":
            reader = ipc.open_file(source)
            return [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        return [b.num_rows for b in ipc.open_stream(source)]


def plan_of(
    paths: list[Path], options: ReadOptions | None = None, fs: FileSystemSpec | None = None
) -> tuple[FormatPlan, list[ListedFile], FileSystemSpec]:
    fs = fs or FileSystemSpec("file")
    files = list_files([str(p) for p in paths], fs)
    return IpcFormat().plan(Listing.of(files), fs, options or ReadOptions()), files, fs


def read_table(
    fmt: IpcFormat, plan: FormatPlan, fs: FileSystemSpec, options: ReadOptions
) -> pa.Table:
    batches = [b for chunk in plan.chunks for b in fmt.read(chunk, 0, chunk.num_rows, fs, options)]
    return pa.Table.from_batches(batches, plan.schema)


LAYOUTS = {
    "file": {},
    "stream": {"stream": True},
    "file-zstd": {"compression": "zstd"},
    "stream-lz4": {"stream": True, "compression": "lz4"},
    "legacy-stream": {"stream": True, "legacy": True},  # pre-0.15: no continuation marker
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batch_rows_from_headers_equal_pyarrow(tmp_path: Path, layout: str) -> None:
    paths = [
        write_ipc(tmp_path / "a.arrow", np.arange(0, 1000), batch_rows=64, **LAYOUTS[layout]),
        write_ipc(tmp_path / "b.arrow", np.arange(1000, 1000), batch_rows=9, **LAYOUTS[layout]),
        write_ipc(tmp_path / "c.arrow", np.arange(1000, 1100), batch_rows=7, **LAYOUTS[layout]),
    ]
    plan, _, fs = plan_of(paths)
    assert [c.num_rows for c in plan.chunks] == [n for p in paths for n in batch_rows(p)]
    assert all(c.unit_rows == (c.num_rows,) for c in plan.chunks)
    table = read_table(IpcFormat(), plan, fs, ReadOptions())
    want = ipc_table(np.arange(1100))
    assert table.column("id").to_pylist() == list(range(1100))
    assert table.column("kind").to_pylist() == want.column("kind").to_pylist()
    assert table.column("tokens").equals(want.column("tokens"))


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_an_empty_source_has_a_schema_and_no_chunks(tmp_path: Path, stream: bool) -> None:
    path = write_ipc(tmp_path / "e.arrow", np.arange(0), stream=stream)
    plan, files, fs = plan_of([path])
    assert plan.chunks == []
    assert IpcFormat().schema(files[0], fs).equals(plan.schema)
    assert plan.schema.names[-1] == "kind"


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_planning_reads_headers_not_bodies(tmp_path: Path, stream: bool) -> None:
    rows = 400_000  # 4 batches of ~5 MB
    path = tmp_path / "big.arrow"
    table = pa.table({"id": np.arange(rows), "v": np.ones((rows,)), "w": np.zeros(rows)})
    new = ipc.new_stream if stream else ipc.new_file
    with new(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=100_000)
    fs = RecordingSpec()
    plan, _, _ = plan_of([path], fs=fs)
    assert [c.num_rows for c in plan.chunks] == [100_000] * 4
    assert fs.bytes_read() < path.stat().st_size / 4  # a window per header, no bodies


def test_a_stream_chunk_reads_no_batch_before_it(tmp_path: Path) -> None:
    path = write_ipc(tmp_path / "s.arrow", np.arange(20_000), batch_rows=1000, stream=True)
    plan, _, _ = plan_of([path])
    last = plan.chunks[-1]
    fs = RecordingSpec()
    fmt = IpcFormat()
    got = pa.Table.from_batches(list(fmt.read(last, 0, last.num_rows, fs, ReadOptions())))
    assert got.column("id").to_pylist() == list(range(19_000, 20_000))
    fs.calls.clear()  # the walk over the headers is cached; this read is schema + dict + batch
    list(fmt.read(plan.chunks[-2], 0, 1000, fs, ReadOptions()))
    assert fs.bytes_read() < 2 * plan.chunks[-2].num_bytes


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_row_ranges_across_batches(tmp_path: Path, stream: bool) -> None:
    path = write_ipc(tmp_path / "a.arrow", np.arange(1000), batch_rows=64, stream=stream)
    plan, _, fs = plan_of([path], ReadOptions(split_rows=1000))
    (chunk,) = plan.chunks
    assert chunk.unit_rows == tuple(batch_rows(path))
    whole = ipc_table(np.arange(1000))
    fmt = IpcFormat()
    for a, b in [(0, 1000), (63, 65), (64, 128), (100, 900), (999, 1000), (7, 7)]:
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
@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_regrouping_by_rows(
    tmp_path: Path, options: ReadOptions, rows: list[int], stream: bool
) -> None:
    path = write_ipc(tmp_path / "a.arrow", np.arange(1000), batch_rows=64, stream=stream)
    plan, _, fs = plan_of([path], options)
    assert [c.num_rows for c in plan.chunks] == rows
    table = read_table(IpcFormat(), plan, fs, options)
    assert table.column("id").to_pylist() == list(range(1000))
    again, _, _ = plan_of([path], options)
    assert again.chunks == plan.chunks  # deterministic


def test_regrouping_by_bytes(tmp_path: Path) -> None:
    path = write_ipc(tmp_path / "a.arrow", np.arange(1000), batch_rows=64)
    one, _, _ = plan_of([path])
    size = one.chunks[0].num_bytes
    plan, _, fs = plan_of([path], ReadOptions(split_bytes=3 * size))
    assert 1 < len(plan.chunks) < len(one.chunks)
    assert sum(c.num_bytes for c in plan.chunks) == sum(c.num_bytes for c in one.chunks)
    table = read_table(IpcFormat(), plan, fs, ReadOptions())
    assert table.column("id").to_pylist() == list(range(1000))


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_projection_keeps_the_requested_order(tmp_path: Path, stream: bool) -> None:
    path = write_ipc(tmp_path / "a.arrow", np.arange(300), stream=stream, compression="zstd")
    options = ReadOptions(columns=("kind", "id"))
    plan, _, fs = plan_of([path], options)
    assert plan.schema.names == ["kind", "id"]
    batches = list(IpcFormat().read(plan.chunks[1], 10, 20, fs, options))
    assert batches and all(b.schema.equals(plan.schema) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("id").to_pylist() == list(range(110, 120))
    assert table.column("kind").to_pylist() == [f"kind-{i % 3}" for i in range(110, 120)]


def test_a_missing_column_and_schema_drift(tmp_path: Path) -> None:
    a = write_ipc(tmp_path / "a.arrow", np.arange(10))
    with pytest.raises(ColumnNotFoundError, match="nope"):
        plan_of([a], ReadOptions(columns=("nope",)))
    b = tmp_path / "b.arrow"
    with ipc.new_stream(str(b), pa.schema([("id", pa.float64())])) as writer:
        writer.write_table(pa.table({"id": [1.5]}))
    with pytest.raises(SchemaMismatchError, match=r"b\.arrow.*a\.arrow|a\.arrow.*b\.arrow"):
        plan_of([a, b], ReadOptions(columns=("id",)))


def _half(data: bytes) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    ("stream", "damage", "message"),
    [
        (False, lambda data: b"", r"empty \(0 bytes\)"),
        (False, _half, "does not end with it.*truncated"),
        (False, lambda data: data[:-3], "does not end with it"),
        (True, _half, "runs past the end"),
        (True, lambda data: data[:5], "past the end"),
        (True, lambda data: b"not arrow at all" * 20, "this looks like CSV/JSON text"),
        (False, lambda data: data[:12] + b"\x13" * (len(data) - 24) + data[-12:], "not a"),
    ],
    ids=[
        "zero-bytes",
        "file-half",
        "file-tail-cut",
        "stream-half",
        "stream-head",
        "garbage",
        "footer",
    ],
)
def test_bad_files_are_corrupt_file_errors_naming_the_file(
    tmp_path: Path, stream: bool, damage: object, message: str
) -> None:
    good = write_ipc(tmp_path / "good.arrow", np.arange(500), stream=stream)
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(damage(good.read_bytes()))  # type: ignore[operator]
    with pytest.raises(CorruptFileError, match=f"{bad}.*{message}"):
        plan_of([good, bad])
    file = ListedFile(str(bad), bad.stat().st_size, str(tmp_path))
    with pytest.raises(CorruptFileError, match=str(bad)):
        IpcFormat().schema(file, FileSystemSpec("file"))


def test_feather_v1_says_how_to_convert(tmp_path: Path) -> None:
    path = tmp_path / "old.feather"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        feather.write_feather(pa.table({"id": [1, 2]}), str(path), version=1)
    with pytest.raises(CorruptFileError, match=rf"{path}: a Feather v1 file.*write_feather"):
        plan_of([path])


def test_a_stream_that_lost_batches_after_planning(tmp_path: Path) -> None:
    path = write_ipc(tmp_path / "s.arrow", np.arange(500), stream=True)
    plan, _, fs = plan_of([path])
    write_ipc(path, np.arange(100), stream=True)  # rewritten: one batch
    with pytest.raises(CorruptFileError, match=rf"{path}: has 1 record batches.*changed"):
        list(IpcFormat().read(plan.chunks[-1], 0, 100, fs, ReadOptions()))


def test_registry_aliases_and_pickling(tmp_path: Path) -> None:
    for name in ("ipc", "arrow", "feather"):
        assert isinstance(get_format(name), IpcFormat)
    fmt = IpcFormat()
    assert fmt.name == "ipc"
    path = write_ipc(tmp_path / "a.arrow", np.arange(200))
    plan, _, fs = plan_of([path])
    list(fmt.read(plan.chunks[0], 0, 10, fs, ReadOptions()))  # opens the file
    assert fmt._open
    clone = pickle.loads(pickle.dumps(fmt))
    assert not clone._open  # open files stay behind
    assert read_table(clone, plan, fs, ReadOptions()).column("id").to_pylist() == list(range(200))


@pytest.mark.parametrize("stream", [False, True])
def test_a_file_deleted_after_planning_is_a_storage_error(tmp_path: Path, stream: bool) -> None:
    path = write_ipc(tmp_path / "a.arrow", np.arange(300), stream=stream)
    plan, files, _ = plan_of([path])
    fmt = IpcFormat()
    first = [b for b in fmt.read(plan.chunks[0], 0, 100, FileSystemSpec("file"), ReadOptions())]
    assert [i for b in first for i in b.column("id").to_pylist()] == list(range(100))
    path.unlink()
    if stream:  # its layout and kind are remembered: the batches' range read fails
        with pytest.raises(StorageNotFoundError, match=str(path)):
            list(fmt.read(plan.chunks[1], 0, 100, FileSystemSpec("file"), ReadOptions()))
    with pytest.raises(StorageNotFoundError, match=str(path)):
        list(IpcFormat().read(plan.chunks[1], 0, 100, FileSystemSpec("file"), ReadOptions()))
    with pytest.raises(StorageNotFoundError, match=str(path)):  # planning, listed before
        IpcFormat().plan(Listing.of(files), FileSystemSpec("file"), ReadOptions())
