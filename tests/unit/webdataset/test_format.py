"""``format="webdataset"``: sources, columns, missing components, decoding, chunks, bad input."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import webdataset as wds
from PIL import Image

import torch_dataloader_utils as tdu
from tests.conftest import first_error
from torch_dataloader_utils.errors import (
    ColumnNotFoundError,
    CorruptFileError,
    FileChangedError,
    InvalidArgumentError,
    InvalidSourceError,
    MissingComponentError,
)
from torch_dataloader_utils.formats import Listing
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.webdataset.format import WebDatasetFormat
from torch_dataloader_utils.webdataset.index import build_index, format_index, index_path


def write(path: Path, samples: Sequence[dict[str, Any]]) -> Path:
    """One shard written by webdataset's TarWriter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as writer:
        for sample in samples:
            writer.write(sample)
    return path


def write_index(shard: Path) -> Path:
    """The shard's DALI index beside it."""
    data = shard.read_bytes()
    index = build_index(lambda o, n: data[o : o + n], len(data), where=str(shard))
    target = Path(index_path(str(shard)))
    target.write_text(format_index(index))
    return target


def samples(lo: int, hi: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"__key__": f"k{i:04d}", "id": str(i), "cls": i % 3, **extra} for i in range(lo, hi)]


def loader(source: Any, **options: Any) -> tdu.TabularDataLoader:
    options.setdefault("batch_size", 7)
    options.setdefault("shuffle", False)
    options.setdefault("num_workers", 0)
    format_options = {"index_cache_dir": "", **options.pop("format_options", {})}
    return tdu.create_dataloader(
        source, format="webdataset", format_options=format_options, **options
    )


def ids_of(source: Any, **options: Any) -> list[int]:
    return [int(i) for b in loader(source, **options) for i in b["id"]]


def whole(source: Any, **options: Any) -> dict[str, list[Any]]:
    """Every batch of the loader (output_format="dict"), column by column."""
    out: dict[str, list[Any]] = {}
    for batch in loader(source, output_format="dict", **options):
        for name, values in batch.items():
            out.setdefault(name, []).extend(values)
    return out


def test_sources_directory_glob_list_braces(tmp_path: Path) -> None:
    root = tmp_path / "shards"
    for s in range(4):
        write(root / f"train-{s:06d}.tar", samples(10 * s, 10 * s + 5))
    write_index(root / "train-000001.tar")  # an .idx beside a shard is not a shard
    everything = list(range(0, 5)) + list(range(10, 15)) + list(range(20, 25)) + [30, 31, 32]
    everything += [33, 34]
    assert ids_of(str(root)) == everything
    assert ids_of(str(root / "*.tar")) == everything
    assert ids_of(str(root / "train-{000001..000002}.tar")) == list(range(10, 15)) + list(
        range(20, 25)
    )
    assert ids_of([str(root / "train-000003.tar"), str(root / "train-000000.tar")]) == [
        30,
        31,
        32,
        33,
        34,
        0,
        1,
        2,
        3,
        4,
    ]
    fmt = WebDatasetFormat()
    listed = list_files(str(root), FileSystemSpec("file"))
    assert [fmt.companion(f.path) for f in listed] == [False, True, False, False, False]


def test_default_columns_and_types(tmp_path: Path) -> None:
    shard = write(tmp_path / "a.tar", samples(0, 9, txt="hé", json={"a": 1}, bin=b"\x00\x01"))
    batches = list(loader(str(shard), output_format="arrow", batch_size=4, drop_last=False))
    table = pa.Table.from_batches(batches)
    assert table.schema.names == ["__key__", "__url__", "bin", "cls", "id", "json", "txt"]
    types = dict(zip(table.schema.names, table.schema.types, strict=True))
    assert types["cls"] == pa.int64() and types["id"] == pa.int64()
    assert types["txt"] == pa.string() and types["bin"] == pa.binary()
    assert table.column("__url__").to_pylist() == [str(shard)] * 9
    keys = [f"k{i:04d}" for i in range(9)]
    assert Counter(table.column("__key__").to_pylist()) == Counter(keys)
    got = whole(str(shard), batch_size=4, drop_last=False)
    assert Counter(got["__key__"]) == Counter(keys)
    assert got["json"] == [{"a": 1}] * 9 and got["txt"] == ["hé"] * 9
    assert got["bin"] == [b"\x00\x01"] * 9
    classes = torch.cat([b["cls"] for b in loader(str(shard), batch_size=4, drop_last=False)])
    assert torch.equal(classes, torch.tensor([i % 3 for i in range(9)]))


def test_alternatives_take_the_first_present(tmp_path: Path) -> None:
    shard = write(
        tmp_path / "a.tar",
        [
            {"__key__": "a", "jpg": b"J", "png": b"P"},
            {"__key__": "b", "png": b"P2"},
            {"__key__": "c", "jpg": b"J3"},
        ],
    )
    got = whole(str(shard), columns=["__key__", "png;jpg"], batch_size=2, drop_last=False)
    assert got == {"__key__": ["a", "b", "c"], "png;jpg": [b"P", b"P2", b"J3"]}
    got = whole(str(shard), columns=["jpg; png", "__key__"], batch_size=2, drop_last=False)
    assert got == {"jpg; png": [b"J", b"P2", b"J3"], "__key__": ["a", "b", "c"]}
    with pytest.raises(InvalidArgumentError, match="decode differently"):
        loader(str(shard), columns=["cls;jpg"])


def test_extension_case(tmp_path: Path) -> None:
    shard = write(
        tmp_path / "a.tar",
        [{"__key__": k, "JPG": k.encode(), "Cls": b"1"} for k in ("a", "b", "c")],
    )
    assert whole(str(shard), batch_size=2) == {
        "__key__": ["a", "b", "c"],
        "__url__": [str(shard)] * 3,
        "cls": [1] * 3,
        "jpg": [b"a", b"b", b"c"],
    }
    got = whole(str(shard), columns=["JPG", "__key__"], batch_size=2)
    assert got == {"JPG": [b"a", b"b", b"c"], "__key__": ["a", "b", "c"]}  # named as asked
    sensitive = {"case_sensitive_extensions": True}
    got = whole(str(shard), batch_size=2, format_options=sensitive)
    assert Counter(got["__key__"]) == Counter("abc")
    assert got["JPG"] == [b"a", b"b", b"c"] and got["Cls"] == [1] * 3  # decoded as a class
    with pytest.raises(ColumnNotFoundError, match=r"'jpg'.*extensions found: \['Cls', 'JPG'\]"):
        loader(str(shard), columns=["jpg"], format_options=sensitive)


def heterogeneous(tmp_path: Path) -> Path:
    root = tmp_path / "mixed"
    write(root / "s0.tar", samples(0, 4, txt="t"))
    write(root / "s1.tar", [*samples(4, 6, txt="t"), *samples(6, 7), *samples(7, 9, txt="t")])
    return root


def test_missing_component_error_is_raised_at_planning(tmp_path: Path) -> None:
    root = heterogeneous(tmp_path)
    with pytest.raises(MissingComponentError) as info:
        loader(str(root), columns=["id", "txt"])
    message = str(info.value)
    assert str(root / "s1.tar") in message and "key 'k0006'" in message and "'txt'" in message
    assert ids_of(str(root), columns=["id", "cls"]) == list(range(9))  # not asked: no error


def test_missing_component_skip_counts_exactly(tmp_path: Path) -> None:
    root = heterogeneous(tmp_path)
    options = {"columns": ["id", "txt"], "format_options": {"missing_component": "skip"}}
    dataset = loader(str(root), **options).dataset
    assert dataset.plan.num_rows == 8
    assert ids_of(str(root), **options) == [0, 1, 2, 3, 4, 5, 7, 8]
    assert sorted(ids_of(str(root), split_rows=1, shuffle=True, **options)) == [
        0,
        1,
        2,
        3,
        4,
        5,
        7,
        8,
    ]


def test_missing_component_empty(tmp_path: Path) -> None:
    root = tmp_path / "e"
    write(
        root / "s.tar",
        [
            {"__key__": "a", "id": "0", "cls": "1", "json": b"{}", "bin": b"xy", "txt": "t"},
            {"__key__": "b", "id": "1"},
            {"__key__": "c", "id": "2", "cls": "2", "json": b"[1]", "bin": b"z", "txt": "u"},
        ],
    )
    empty = {"missing_component": "empty"}
    got = next(iter(loader(str(root), output_format="dict", format_options=empty)))
    assert got["cls"] == [1, None, 2] and got["json"] == [{}, None, [1]]
    assert got["bin"] == [b"xy", b"", b"z"] and got["txt"] == ["t", "", "u"]
    # A null class is a null, under the loader's null_policy.
    batch = next(iter(loader(str(root), columns=["cls"], null_policy="fill", format_options=empty)))
    assert batch["cls"].tolist() == [1, 0, 2]
    with pytest.raises(tdu.errors.NullValueError, match="'cls'"):
        next(iter(loader(str(root), columns=["cls"], format_options=empty)))


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_default_columns_are_every_shards_extensions(tmp_path: Path) -> None:
    # The first shard lacks "txt", the second "bin": with columns=None the plan (and each
    # worker's batches, one shard each) hold both, in order of first appearance.
    root = tmp_path / "mixed"
    write(root / "a.tar", samples(0, 6, bin=b"b"))
    write(root / "b.tar", [{"__key__": f"k{i}", "id": str(i), "txt": "t"} for i in range(6, 12)])
    with pytest.raises(MissingComponentError, match=r"a\.tar: sample 0 .* no 'txt' component"):
        loader(str(root))
    empty = {"missing_component": "empty"}
    data = loader(str(root), format_options=empty, output_format="arrow", num_workers=2)
    names = ["__key__", "__url__", "bin", "cls", "id", "txt"]
    assert data.dataset.plan.schema.names == names
    batches = list(data)
    assert {tuple(b.schema.names) for b in batches} == {tuple(names)}
    rows = pa.Table.from_batches(batches).to_pylist()
    assert Counter(r["id"] for r in rows) == Counter(range(12))
    for r in rows:
        first = r["id"] < 6
        assert r["bin"] == (b"b" if first else b"") and r["txt"] == ("" if first else "t")
        assert r["cls"] == (r["id"] % 3 if first else None)
    # Skipping samples that lack a column: every sample lacks "bin" or "txt".
    skipped = loader(str(root), format_options={"missing_component": "skip"})
    assert sum(c.num_rows for c in skipped.dataset.plan.chunks) == 0


def test_unknown_column_and_options(tmp_path: Path) -> None:
    shard = write(tmp_path / "a.tar", samples(0, 2))
    with pytest.raises(ColumnNotFoundError, match=r"'jpg'.*extensions found: \['cls', 'id'\]"):
        loader(str(shard), columns=["jpg"])
    with pytest.raises(InvalidArgumentError, match="missing_component"):
        WebDatasetFormat(missing_component="ignore")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="does not take"):
        loader(str(shard), format_options={"lowercase": True})


def png(value: int, size: int = 3) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((size, size + 1, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def to_upper(value: bytes) -> str:
    return value.decode().upper()


def test_decoding_options(tmp_path: Path) -> None:
    array = np.arange(4, dtype=np.int16)
    buffer = io.BytesIO()
    np.save(buffer, array)
    shard = write(
        tmp_path / "a.tar",
        [
            {
                "__key__": f"k{i}",
                "cls": i,
                "png": png(i),
                "npy": buffer.getvalue(),
                "pyd": pickle.dumps({"i": i}),
                "tag": b"abc",
            }
            for i in range(3)
        ],
    )
    plain = next(iter(loader(str(shard))))
    assert isinstance(plain["png"][0], bytes) and plain["pyd"][0] == pickle.dumps({"i": 0})
    assert plain["npy"].shape == (3, 4) and plain["npy"].dtype == torch.int16  # stacked
    options = {"decode_images": True, "allow_pickle": True, "decoders": {"tag": to_upper}}
    got = next(iter(loader(str(shard), format_options=options)))
    assert got["png"].shape == (3, 3, 4, 3) and got["png"].dtype == torch.uint8
    assert got["png"][:, 0, 0, 0].tolist() == [0, 1, 2]
    assert got["pyd"] == [{"i": 0}, {"i": 1}, {"i": 2}] and got["tag"] == ["ABC"] * 3
    raw = next(iter(loader(str(shard), format_options={"decode": False}, output_format="dict")))
    assert raw["cls"] == [b"0", b"1", b"2"] and isinstance(raw["npy"][0], bytes)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_custom_decoders_reach_workers(tmp_path: Path, context: str) -> None:
    shard = write(tmp_path / "a.tar", [{"__key__": f"k{i}", "tag": b"ab"} for i in range(20)])
    got = loader(
        str(shard),
        num_workers=2,
        multiprocessing_context=context,
        output_format="dict",
        split_rows=5,
        format_options={"decoders": {"tag": to_upper}},
    )
    keys = [k for batch in got for k in batch["__key__"]]
    assert Counter(keys) == Counter(f"k{i}" for i in range(20))
    assert all(v == "AB" for batch in got for v in batch["tag"])


def test_bad_values_name_the_shard_and_sample(tmp_path: Path) -> None:
    shard = write(tmp_path / "a.tar", [*samples(0, 3), {"__key__": "bad", "id": "3", "cls": "x"}])
    with pytest.raises(CorruptFileError) as info:  # at planning: it reads a first sample
        first_error(loader(str(shard)))
    assert f"{shard}: sample 3 (key 'bad'), component 'cls' at offset " in str(info.value)
    shard = write(tmp_path / "b.tar", [{"__key__": "k", "txt": b"\xff\xfe"}])
    with pytest.raises(CorruptFileError, match=r"b.tar: sample 0 \(key 'k'\), component 'txt'"):
        first_error(loader(str(shard)))
    shard = write(tmp_path / "c.tar", [{"__key__": "k", "json": b"{not json"}])
    error = first_error(loader(str(shard), columns=["json"]))
    assert isinstance(error, CorruptFileError) and "cannot decode a 'json' component" in str(error)


def test_chunks_are_sample_ranges(tmp_path: Path) -> None:
    root = tmp_path / "c"
    write(root / "a.tar", samples(0, 10, bin=b"x" * 1000))
    write(root / "b.tar", samples(10, 13, bin=b"x" * 1000))
    plan = loader(str(root)).dataset.plan
    assert [(c.start, c.stop, c.num_rows) for c in plan.chunks] == [(0, 10, 10), (0, 3, 3)]
    assert plan.chunks[0].num_bytes == 10 * (1000 + 1 + 1)  # bin + cls + id of each sample
    plan = loader(str(root), split_rows=4).dataset.plan
    assert [(c.start, c.stop) for c in plan.chunks] == [(0, 4), (4, 8), (8, 10), (0, 3)]
    plan = loader(str(root), split_bytes=2500, columns=["bin"]).dataset.plan
    assert [(c.start, c.stop) for c in plan.chunks] == [(0, 3), (3, 6), (6, 9), (9, 10), (0, 3)]
    assert ids_of(str(root), split_rows=1, shuffle=True, batch_size=4) != list(range(13))
    assert sorted(ids_of(str(root), split_rows=1, shuffle=True)) == list(range(13))


def test_large_reads_are_cut_into_range_requests(tmp_path: Path) -> None:
    from torch_dataloader_utils.webdataset import slicing as module

    shard = write(tmp_path / "a.tar", samples(0, 40, bin=b"y" * 3000))
    fmt = WebDatasetFormat(index_cache_dir="")
    fs = FileSystemSpec("file")
    files = list_files(str(shard), fs)
    plan = fmt.plan(Listing.of(files), fs, tdu.ReadOptions())
    old = module.READ_BYTES
    module.READ_BYTES = 10_000  # about 3 samples per request
    try:
        batches = list(fmt.read(plan.chunks[0], 5, 40, fs, tdu.ReadOptions()))
    finally:
        module.READ_BYTES = old
    assert len(batches) > 8 and sum(b.num_rows for b in batches) == 35
    ids = [i for b in batches for i in b.column("id").to_pylist()]
    assert ids == list(range(5, 40))


# --- bad input: a clear error naming the shard and the offset --------------------------------


def tar_bytes(members: Sequence[tuple[str, bytes]], **extra: tarfile.TarInfo) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra.values():
            tar.addfile(info)
    return out.getvalue()


MEMBERS = [("a.id", b"0"), ("a.cls", b"1"), ("b.id", b"1"), ("b.cls", b"2")]


def plan_error(path: Path) -> BaseException:
    with pytest.raises(CorruptFileError) as info:
        loader(str(path))
    return info.value


def test_truncated_shard(tmp_path: Path) -> None:
    data = tar_bytes(MEMBERS)
    (tmp_path / "t.tar").write_bytes(data[:1800])
    message = str(plan_error(tmp_path / "t.tar"))
    assert f"{tmp_path / 't.tar'}: offset 1024" in message and "past the end" in message


def test_bad_header_checksum(tmp_path: Path) -> None:
    data = bytearray(tar_bytes(MEMBERS))
    data[1024 + 10] ^= 0xFF  # inside the name of the second member's header
    (tmp_path / "h.tar").write_bytes(bytes(data))
    message = str(plan_error(tmp_path / "h.tar"))
    assert f"{tmp_path / 'h.tar'}: offset 1024" in message and "checksum" in message


def test_repeated_extension(tmp_path: Path) -> None:
    (tmp_path / "r.tar").write_bytes(tar_bytes([("a.id", b"0"), ("a.id", b"1")]))
    message = str(plan_error(tmp_path / "r.tar"))
    assert str(tmp_path / "r.tar") in message and "'id'" in message and "offset" in message


def test_non_regular_member(tmp_path: Path) -> None:
    link = tarfile.TarInfo("b.cls")
    link.type, link.linkname = tarfile.SYMTYPE, "a.cls"
    (tmp_path / "l.tar").write_bytes(tar_bytes(MEMBERS[:2], link=link))
    message = str(plan_error(tmp_path / "l.tar"))
    assert f"{tmp_path / 'l.tar'}: offset 2048" in message and "symlink" in message


def test_empty_shards_hold_no_samples(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    (root / "a.tar").write_bytes(tar_bytes(MEMBERS))
    (root / "b.tar").write_bytes(b"")  # zero bytes
    (root / "c.tar").write_bytes(tar_bytes([]))  # just the end-of-archive blocks
    assert ids_of(str(root)) == [0, 1]
    plan = loader(str(root / "c.tar"), format_options={}).dataset.plan
    assert plan.num_rows == 0 and plan.schema.names == ["__key__", "__url__"]


def test_shard_changed_after_planning(tmp_path: Path) -> None:
    root = tmp_path / "changed"
    shard = write(root / "a.tar", samples(0, 20, bin=b"x" * 700))
    write_index(shard)
    built = loader(str(root))
    # Rewritten with other sizes, same length: the .idx (checked against the size) is stale.
    data = shard.read_bytes()
    times = shard.stat()
    other = write(tmp_path / "other.tar", samples(0, 25, bin=b"x" * 100))
    shard.write_bytes(other.read_bytes()[: len(data)].ljust(len(data), b"\0"))
    error = first_error(built)
    assert isinstance(error, FileChangedError) and f"{shard}: changed after planning" in str(error)
    # The same size and modification time (a copy that kept them): the index check catches it.
    os.utime(shard, ns=(times.st_atime_ns, times.st_mtime_ns))
    error = first_error(built)
    assert isinstance(error, CorruptFileError)
    assert f"{shard}: sample " in str(error) and "changed since its index" in str(error)
    # Fewer samples now (no .idx: the worker's index is rebuilt): the plan no longer fits.
    os.remove(index_path(str(shard)))
    write(shard, samples(0, 20))
    built = loader(str(root))
    write(shard, samples(0, 5))
    error = first_error(built)
    assert isinstance(error, FileChangedError) and "bytes then" in str(error)


def test_pipe_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSourceError, match=r"pipe.*not supported.*s3://"):
        loader(f"pipe:cat {tmp_path}/a.tar")


def test_json_values_stay_python_objects_in_workers(tmp_path: Path) -> None:
    shard = write(tmp_path / "a.tar", [{"__key__": f"k{i}", "json": {"i": i}} for i in range(9)])
    got = loader(str(shard), num_workers=2, multiprocessing_context="fork", split_rows=3)
    values = sorted(v["i"] for batch in got for v in batch["json"])
    assert values == list(range(9))
    assert json.dumps(values)
