"""Reading WebDataset shards: no-column reads, header checks at read time (V7 tars, stale
indexes), names that are not UTF-8, compressed shards, uncached indexes, storage errors, how
much of a shard a projection reads, and values beyond 2 GiB offsets."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.errors import (
    CorruptFileError,
    DataError,
    StorageError,
    TorchDataloaderUtilsWarning,
    UnsupportedFileError,
)
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.fs.forks import ProcessLocal
from torch_dataloader_utils.webdataset import loading, slicing
from torch_dataloader_utils.webdataset.format import WebDatasetFormat
from torch_dataloader_utils.webdataset.index import build_index, format_index, index_path


def tar_bytes(members: Sequence[tuple[str, bytes]], **options: Any) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", **options) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def members(lo: int, hi: int, **extra: bytes) -> list[tuple[str, bytes]]:
    """Samples ``k{i:04d}`` with ``id`` (text), ``cls`` and the ``extra`` components."""
    out = []
    for i in range(lo, hi):
        out += [(f"k{i:04d}.id", str(i).encode()), (f"k{i:04d}.cls", str(i % 3).encode())]
        out += [(f"k{i:04d}.{ext}", data) for ext, data in extra.items()]
    return out


def write_index(shard: Path) -> None:
    data = shard.read_bytes()
    index = build_index(lambda o, n: data[o : o + n], len(data), where=str(shard))
    Path(index_path(str(shard))).write_text(format_index(index))


def plan_of(path: Path, **options: Any) -> tuple[WebDatasetFormat, Any, FileSystemSpec]:
    fmt = WebDatasetFormat(index_cache_dir="")
    fs = FileSystemSpec("file")
    files = list_files(str(path), fs)
    return fmt, fmt.plan(Listing.of(files), fs, ReadOptions(**options)), fs


def read_all(
    fmt: WebDatasetFormat, plan: Any, fs: FileSystemSpec, options: ReadOptions
) -> pa.Table:
    batches = [
        b for c in plan.chunks for b in fmt.read(c, 0, c.num_rows, fs, options) if b.num_rows
    ]
    return pa.Table.from_batches(batches)


# --- no component columns -----------------------------------------------------------------


def test_hive_keys_only_and_partition_filters_keep_every_row(tmp_path: Path) -> None:
    for k in (0, 1):
        (tmp_path / f"k={k}").mkdir()
        (tmp_path / f"k={k}" / "a.tar").write_bytes(tar_bytes(members(100 * k, 100 * k + 20)))
    options: dict[str, Any] = {
        "format": "webdataset",
        "batch_size": 6,
        "partitioning": "hive",
        "output_format": "dict",
        "format_options": {"index_cache_dir": ""},
    }
    keys = [
        k for b in tdu.create_dataloader(str(tmp_path), columns=["k"], **options) for k in b["k"]
    ]
    assert Counter(keys) == Counter({0: 20, 1: 20})
    loader = tdu.create_dataloader(
        str(tmp_path), columns=["id", "cls"], filters=pc.field("k") == 1, **options
    )
    assert loader.dataset.plan.filtered_rows is not None
    assert sum(loader.dataset.plan.filtered_rows) == 20  # counted with no component read
    ids = [int(i) for b in loader for i in b["id"]]
    assert Counter(ids) == Counter(range(100, 120))


def test_skipped_samples_stay_skipped_when_counting_a_filter(tmp_path: Path) -> None:
    data = []
    for i in range(20):
        data += [(f"s{i:02d}.id", str(i).encode())]
        data += [(f"s{i:02d}.cls", b"1")] if i % 3 else []
    (tmp_path / "a.tar").write_bytes(tar_bytes(data))
    loader = tdu.create_dataloader(
        str(tmp_path),
        format="webdataset",
        batch_size=4,
        columns=["id", "cls"],
        filters=pc.field("__key__") >= "s05",
        output_format="dict",
        format_options={"index_cache_dir": "", "missing_component": "skip"},
    )
    ids = [int(i) for b in loader for i in b["id"]]
    assert Counter(ids) == Counter(i for i in range(5, 20) if i % 3)


# --- header checks at read time -----------------------------------------------------------


def as_v7(data: bytes) -> bytes:
    """A ustar tar turned V7: no magic, version, owner names, device numbers or prefix (what
    ``tar --format=v7`` writes), checksums recomputed."""
    out = bytearray(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        offsets = [m.offset for m in tar.getmembers()]
    for at in offsets:
        out[at + 257 : at + 500] = bytes(243)
        out[at + 148 : at + 156] = b" " * 8
        out[at + 148 : at + 156] = b"%06o\0 " % sum(out[at : at + 512])
    return bytes(out)


def test_v7_tars_are_read(tmp_path: Path) -> None:
    shard = tmp_path / "v7.tar"
    shard.write_bytes(as_v7(tar_bytes(members(0, 12, txt=b"hello"), format=tarfile.USTAR_FORMAT)))
    with tarfile.open(shard) as tar:
        assert all(m.name.startswith("k") for m in tar)  # (still a valid tar)
    assert b"ustar" not in shard.read_bytes()
    fmt, plan, fs = plan_of(shard)
    table = read_all(fmt, plan, fs, ReadOptions())
    assert Counter(table.column("id").to_pylist()) == Counter(range(12))
    assert table.column("txt").to_pylist() == ["hello"] * 12


def test_stale_index_of_a_reordered_shard(tmp_path: Path) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(tar_bytes(members(0, 10)))  # every id and cls one byte long
    write_index(shard)
    fmt, plan, fs = plan_of(shard)
    assert Counter(read_all(fmt, plan, fs, ReadOptions()).column("id").to_pylist()) == Counter(
        range(10)
    )
    # Rewritten with the samples reversed: the same size, the same offsets, other names.
    reordered = tar_bytes(members(0, 10)[::-1])
    assert len(reordered) == shard.stat().st_size
    shard.write_bytes(reordered)
    fmt, plan, fs = plan_of(shard)  # the stale .idx still passes the size check
    with pytest.raises(CorruptFileError) as info:
        read_all(fmt, plan, fs, ReadOptions(columns=("__key__", "id")))
    message = str(info.value)
    assert f"{shard}: sample 0 (key 'k0000')" in message
    assert "'k0009.cls'" in message and "changed since its index was made" in message


@pytest.mark.parametrize(
    ("stem", "form"),
    [
        ("d" * 600 + "/k", tarfile.PAX_FORMAT),  # past the name field: a PAX header holds it
        ("d" * 600 + "/k", tarfile.GNU_FORMAT),  # a GNU long-name header
        ("dir-" + "x" * 90 + "/k", tarfile.USTAR_FORMAT),  # split into prefix and name
        ("caf\xe9/k", tarfile.PAX_FORMAT),  # not ASCII: the ustar header holds "caf?"
    ],
    ids=["pax", "gnu", "ustar-prefix", "non-ascii"],
)
def test_names_the_header_cannot_hold_are_read(tmp_path: Path, stem: str, form: int) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(
        tar_bytes([(f"{stem}{i}.id", str(i).encode()) for i in range(5)], format=form)
    )
    write_index(shard)
    fmt, plan, fs = plan_of(shard)
    table = read_all(fmt, plan, fs, ReadOptions())
    assert Counter(table.column("id").to_pylist()) == Counter(range(5))
    assert table.column("__key__").to_pylist() == [f"{stem}{i}" for i in range(5)]


def test_member_names_that_are_not_utf8(tmp_path: Path) -> None:
    shard = tmp_path / "latin.tar"
    shard.write_bytes(
        tar_bytes(
            [(f"caf\xe9{i}.txt", b"x") for i in range(3)],
            format=tarfile.GNU_FORMAT,
            encoding="latin-1",
        )
    )
    with pytest.raises(CorruptFileError, match=rf"{shard}: member b'caf\\xe90.txt' .*offset 512"):
        plan_of(shard)


@pytest.mark.parametrize(
    "compress",
    [
        gzip.compress,
        bz2.compress,
        lzma.compress,
        lambda data: pa.Codec("zstd").compress(data, asbytes=True),
    ],
    ids=["gzip", "bzip2", "xz", "zstd"],
)
def test_compressed_shards_are_refused(tmp_path: Path, compress: Any) -> None:
    shard = tmp_path / "a.tar.gz"
    shard.write_bytes(compress(tar_bytes(members(0, 3))))
    compressed = rf"{shard}: offset 0: the shard is .*-compressed"
    with pytest.raises(UnsupportedFileError, match=compressed):
        plan_of(shard)


# --- indexes: caching and storage errors --------------------------------------------------


def test_an_uncached_index_warns_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loading, "_warned", ProcessLocal(list))
    for s in range(3):
        (tmp_path / f"s{s}.tar").write_bytes(tar_bytes(members(10 * s, 10 * s + 4)))
    with pytest.warns(TorchDataloaderUtilsWarning) as caught:
        for _ in range(2):
            fmt, plan, fs = plan_of(tmp_path)
            ids = read_all(fmt, plan, fs, ReadOptions()).column("id").to_pylist()
            assert Counter(ids) == Counter([*range(4), *range(10, 14), *range(20, 24)])
    warned = [str(w.message) for w in caught]
    assert len(warned) == 1
    assert "cannot be cached" in warned[0] and "tdu index" in warned[0]
    assert "index_cache_dir" in warned[0]
    # A writable cache: no warning.
    monkeypatch.setattr(loading, "_warned", ProcessLocal(list))
    fs = FileSystemSpec("file")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loading.load_index(
            str(tmp_path / "s0.tar"),
            fs,
            size=(tmp_path / "s0.tar").stat().st_size,
            cache_dir=str(tmp_path / "cache"),
        )


def test_storage_failures_while_scanning_are_storage_errors(tmp_path: Path) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(tar_bytes(members(0, 3)))
    fs = FileSystemSpec("file")
    size = shard.stat().st_size + 4096  # listed longer than it is: the read comes back short
    with pytest.raises(StorageError, match=str(shard)) as info:
        loading.load_index(str(shard), fs, size=size, cache_dir="")
    assert not isinstance(info.value, CorruptFileError)


# --- how much a projection reads ----------------------------------------------------------


class RecordingSpec(FileSystemSpec):
    """A real local spec that records each range request; ``remote`` makes the format treat
    it as object storage (reads started ahead, remote gap rules)."""

    def __init__(self, *, remote: bool = False) -> None:
        super().__init__("file")
        self.remote = remote
        self.calls: list[tuple[int, int]] = []
        self.calls_lock = threading.Lock()

    @property
    def is_local(self) -> bool:
        return not self.remote

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        with self.calls_lock:
            self.calls.append((offset, size))
        return super().read_range(path, offset, size)


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_a_small_column_is_read_without_the_large_ones(tmp_path: Path, remote: bool) -> None:
    shard = tmp_path / "img.tar"
    shard.write_bytes(tar_bytes(members(0, 40, jpg=bytes(100_000))))
    write_index(shard)  # (the index is not scanned through the recording spec)
    fmt, plan, _ = plan_of(shard, split_rows=15)
    fs = RecordingSpec(remote=remote)
    table = read_all(fmt, plan, fs, ReadOptions(columns=("__key__", "cls")))
    fmt.close()
    assert Counter(table.column("__key__").to_pylist()) == Counter(f"k{i:04d}" for i in range(40))
    assert table.column("cls").to_pylist() == [i % 3 for i in range(40)]
    read = sum(size for _, size in fs.calls)
    assert read < shard.stat().st_size / 10, (read, len(fs.calls))


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_small_gaps_are_read_through(tmp_path: Path, remote: bool) -> None:
    shard = tmp_path / "small.tar"
    shard.write_bytes(tar_bytes(members(0, 40, txt=b"t" * 300)))
    write_index(shard)  # (the index is not scanned through the recording spec)
    fmt, plan, _ = plan_of(shard)
    fs = RecordingSpec(remote=remote)
    table = read_all(fmt, plan, fs, ReadOptions(columns=("id", "cls")))
    fmt.close()
    assert Counter(table.column("id").to_pylist()) == Counter(range(40))
    assert len(fs.calls) == 1  # the txt between them costs less than a request per sample


def test_remote_gaps_waste_at_most_half(tmp_path: Path) -> None:
    # Each sample: a 3 KB selected component, then a 5 KB one not selected (under HOLE_BYTES,
    # over the selected bytes): no request reads more gap than selected bytes.
    shard = tmp_path / "mixed.tar"
    shard.write_bytes(tar_bytes(members(0, 30, bin=b"b" * 3000, zzz=bytes(5000))))
    write_index(shard)  # (the index is not scanned through the recording spec)
    fmt, plan, _ = plan_of(shard)
    fs = RecordingSpec(remote=True)
    table = read_all(fmt, plan, fs, ReadOptions(columns=("id", "bin")))
    fmt.close()
    assert Counter(table.column("id").to_pylist()) == Counter(range(30))
    assert table.column("bin").to_pylist() == [b"b" * 3000] * 30
    read = sum(size for _, size in fs.calls)
    selected = 30 * (512 + 512 + 512 + 3072)  # headers and padded data of id and bin
    rows = 30 * (1024 + 1024 + 3584)  # each row from its id header to its bin (cls between)
    assert read - rows <= selected  # the zzz read through
    assert read < shard.stat().st_size * 0.95  # (reading through every gap: all of it)


# --- values beyond 32-bit offsets ---------------------------------------------------------


def test_values_past_2_gib_into_a_request() -> None:
    # A zeroed (calloc'd, not resident) buffer of more than 2 GiB: one row's components.
    big = np.zeros((1 << 31) + 8192, np.uint8)
    big[(1 << 31) + 1000 : (1 << 31) + 1005] = np.frombuffer(b"hello", np.uint8)
    off = np.array([512, (1 << 31) + 1000], np.int64)
    values = slicing.slice_values(
        pa.py_buffer(big), 0, off, np.array([3, 5], np.int64), nulls=False
    )
    assert values.type == pa.binary() and values.to_pylist() == [b"\0\0\0", b"hello"]


def test_a_component_too_large_for_a_binary_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(tar_bytes(members(0, 4, bin=b"x" * 3000)))
    fmt, plan, fs = plan_of(shard)
    monkeypatch.setattr(slicing, "MAX_VALUE_BYTES", 2000)  # (2 GiB - 1 in truth)
    with pytest.raises(DataError, match=rf"{shard}: sample 0 .*'bin' .*3000 bytes"):
        read_all(fmt, plan, fs, ReadOptions(columns=("id", "bin")))
    monkeypatch.setattr(slicing, "MAX_VALUE_BYTES", 3000)  # offsets past it: the wide path
    table = read_all(fmt, plan, fs, ReadOptions(columns=("id", "bin")))
    assert Counter(table.column("id").to_pylist()) == Counter(range(4))
    assert table.column("bin").to_pylist() == [b"x" * 3000] * 4
