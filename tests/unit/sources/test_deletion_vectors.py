"""Deletion vectors decoded from their bytes: Z85, the portable 64-bit roaring bitmap, Delta's
inline and on-disk framing, Iceberg v3's Puffin blob; bad bytes are CorruptFileError naming
the vector; deltalake's own decoding of hand-written vectors is the oracle."""

from __future__ import annotations

import uuid
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.delta.tables import MAGIC, dv_bytes, framed, write_dv_table, z85_encode
from torch_dataloader_utils.errors import CorruptFileError, StorageNotFoundError
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.sources.deletion_vectors import (
    DeltaDeletionVector,
    bitmap_positions,
    delta_dv_path,
    puffin_dv_positions,
    read_delta_dv,
    z85_decode,
)

pytest.importorskip("pyroaring")
FS = FileSystemSpec("file")
# Positions over several 16-bit containers and past 2^32 (a second 32-bit bitmap).
POSITIONS = [0, 1, 2, 65535, 65536, 70000, *range(100_000, 100_300), (1 << 32) + 7, (1 << 40) + 1]


def test_z85_decodes_the_rfc_example_and_the_delta_padding() -> None:
    hello = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_decode("HelloWorld") == hello  # ZeroMQ RFC 32's test vector
    assert z85_encode(hello) == "HelloWorld"
    for size in range(0, 13):
        data = bytes(range(7, 7 + size))
        assert z85_decode(z85_encode(data), size) == data  # padded to 4, cut back
    for bad in ("abcd", "Hello~orld", "%%%%%"):
        with pytest.raises(ValueError):
            z85_decode(bad)


def test_a_portable_64_bit_bitmap_decodes_to_sorted_int64() -> None:
    from pyroaring import BitMap64

    data = BitMap64(POSITIONS).serialize()
    assert int.from_bytes(data[:8], "little") == 3  # three 32-bit bitmaps: the portable format
    got = bitmap_positions(data, "v")
    assert got.dtype == np.int64 and got.tolist() == sorted(POSITIONS)
    assert bitmap_positions(BitMap64().serialize(), "v").tolist() == []
    with pytest.raises(CorruptFileError, match="vector-x"):
        bitmap_positions(b"\x05\x00\x00", "vector-x")


def test_an_iceberg_puffin_blob_decodes_and_bad_framing_is_corrupt() -> None:
    blob = framed(dv_bytes(POSITIONS))
    assert puffin_dv_positions(blob, "b").tolist() == sorted(POSITIONS)
    assert blob[4:8] == bytes.fromhex("d1d33964") == MAGIC
    with pytest.raises(CorruptFileError, match="CRC-32"):
        puffin_dv_positions(framed(dv_bytes(POSITIONS), bad_crc=True), "b")
    wrong = blob[:4] + b"\0\0\0\0" + blob[8:-4]
    with pytest.raises(CorruptFileError, match="magic"):
        puffin_dv_positions(wrong + zlib.crc32(wrong[4:]).to_bytes(4, "big"), "b")
    with pytest.raises(CorruptFileError, match="size field says"):
        puffin_dv_positions(blob[:-6], "b")
    with pytest.raises(CorruptFileError, match="truncated"):
        puffin_dv_positions(blob[:6], "b")


def test_inline_and_on_disk_delta_vectors(tmp_path: Path) -> None:
    data = dv_bytes([3, 5, 8])
    inline = DeltaDeletionVector("i", z85_encode(data), None, len(data), 3)
    assert read_delta_dv(inline, str(tmp_path), FS, data_file="f").tolist() == [3, 5, 8]
    name = uuid.uuid4()
    (tmp_path / "zz").mkdir()
    second = dv_bytes(POSITIONS)
    first = framed(data)
    (tmp_path / "zz" / f"deletion_vector_{name}.bin").write_bytes(b"\x01" + first + framed(second))
    stored = DeltaDeletionVector(
        "u", "zz" + z85_encode(name.bytes), 1 + len(first), len(second), len(POSITIONS)
    )
    assert delta_dv_path(stored, "/t") == f"/t/zz/deletion_vector_{name}.bin"
    assert read_delta_dv(stored, str(tmp_path), FS, data_file="f").tolist() == sorted(POSITIONS)
    absolute = DeltaDeletionVector(
        "p", (tmp_path / "zz" / f"deletion_vector_{name}.bin").as_uri(), 1, len(data), 3
    )
    assert read_delta_dv(absolute, "/elsewhere", FS, data_file="f").tolist() == [3, 5, 8]
    with pytest.raises(CorruptFileError, match="log says 4"):
        read_delta_dv(
            DeltaDeletionVector("i", z85_encode(data), None, len(data), 4), "/", FS, data_file="f"
        )
    with pytest.raises(CorruptFileError, match="size field says"):  # another vector's offset
        read_delta_dv(
            DeltaDeletionVector("u", stored.path_or_inline, 1, len(second), 1),
            str(tmp_path),
            FS,
            data_file="f",
        )
    with pytest.raises(StorageNotFoundError):
        read_delta_dv(
            DeltaDeletionVector("u", "zz" + z85_encode(uuid.uuid4().bytes), 1, 4, 1),
            str(tmp_path),
            FS,
            data_file="f",
        )


def test_a_corrupt_delta_vector_file_names_the_file(tmp_path: Path) -> None:
    name = uuid.uuid4()
    path = tmp_path / f"deletion_vector_{name}.bin"
    data = dv_bytes([1, 2])
    path.write_bytes(b"\x01" + framed(data, bad_crc=True))
    dv = DeltaDeletionVector("u", z85_encode(name.bytes), 1, len(data), 2)
    with pytest.raises(CorruptFileError, match=f"deletion_vector_{name}.bin.*CRC-32"):
        read_delta_dv(dv, str(tmp_path), FS, data_file="data.parquet")
    path.write_bytes(b"\x02" + framed(data))
    with pytest.raises(CorruptFileError, match="version byte 02"):
        read_delta_dv(dv, str(tmp_path), FS, data_file="data.parquet")


def test_deltalake_reads_the_hand_written_vectors_as_we_do(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = write_dv_table(tmp_path / "t")
    masks = pa.table(DeltaTable(str(tmp_path / "t")).deletion_vectors()).to_pylist()
    theirs = {
        r["filepath"].rsplit("/", 1)[-1]: np.flatnonzero(~np.asarray(r["selection_vector"]))
        for r in masks
    }
    from torch_dataloader_utils.delta.actions import deletion_vectors

    ours = deletion_vectors(str(tmp_path / "t"), FS, 0, table._live)
    assert sorted(ours) == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    for name, dv in ours.items():
        got = read_delta_dv(dv, str(tmp_path / "t"), FS, data_file=name)
        # deltalake's mask ends at the last deleted row: compare the deleted positions.
        assert got.tolist() == theirs[name].tolist(), name
