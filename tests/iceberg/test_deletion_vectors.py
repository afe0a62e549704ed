"""Format version 3 deletion vectors (Puffin ``deletion-vector-v1`` blobs): applied per data file
at planning (chunks count live rows) and when reading, merged with Parquet position deletes,
checked against pyiceberg's own scan; a corrupt vector is a CorruptFileError."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from tests.iceberg.conftest import (
    Catalog,
    batch_ids,
    commit_deletion_vectors,
    commit_position_deletes,
    data_files,
    flat,
    loader,
    new_catalog,
    upgrade_to_v3,
)
from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.iceberg import UnsupportedTableError

if TYPE_CHECKING:
    from pyiceberg.table import Table

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

# Data files by first id: 5 row groups, 3 row groups, 1 row group (GROUP_ROWS = 100).
PARTS = [range(0, 500), range(500, 750), range(750, 800)]
# Deletion vectors (one Puffin file, a blob per data file): row group edges, the whole row
# group 2 of the first file (200-299), the last row of a file.
VECTORS = {0: [0, 5, 99, 100, *range(200, 300), 499], 500: [1, 100, 249]}
# Parquet position deletes committed before: on the third file, and on the first (5 also in its
# vector: merged, not counted twice).
PARQUET = {750: [0, 10, 49], 0: [5, 7]}


def _first_ids(table: Table) -> dict[int, str]:
    """Each data file's URL by its first id."""
    return {
        pq.read_table(f.file_path.removeprefix("file://"), columns=["id"])["id"][0].as_py(): (
            f.file_path
        )
        for f in data_files(table)
    }


def _gone(*deletes: dict[int, list[int]]) -> set[int]:
    return {first + p for d in deletes for first, positions in d.items() for p in positions}


@pytest.fixture(scope="module")
def dv_table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Catalog, list[int]]]:
    """db.dv (format version 3): PARTS, PARQUET deletes, then VECTORS; the catalog and
    pyiceberg's scan of it (ids)."""
    catalog = new_catalog(tmp_path_factory.mktemp("dv"))
    table = catalog.create("dv", PARTS)
    files = _first_ids(table)
    table = commit_position_deletes(table, {files[k]: v for k, v in PARQUET.items()})
    commit_deletion_vectors(table, {files[k]: v for k, v in VECTORS.items()})
    table = upgrade_to_v3(catalog, "dv")
    assert table.metadata.format_version == 3
    oracle = table.scan().to_arrow()["id"].to_pylist()
    yield catalog, oracle


def test_pyiceberg_applies_the_vectors(dv_table: tuple[Catalog, list[int]]) -> None:
    """The oracle itself: pyiceberg's scan drops exactly the deleted rows."""
    _, oracle = dv_table
    assert Counter(oracle) == Counter(i for i in range(800) if i not in _gone(VECTORS, PARQUET))


@pytest.mark.parametrize(("num_workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_loader_reads_what_pyiceberg_reads(
    dv_table: tuple[Catalog, list[int]], num_workers: int, context: str | None
) -> None:
    """Workers read the vectors themselves (spawned ones get them pickled in the plan)."""
    catalog, oracle = dv_table
    options = {"multiprocessing_context": context} if context else {}
    load, dataset = loader(catalog, "dv", num_workers=num_workers, shuffle=True, **options)
    assert dataset.plan.num_rows == len(oracle)  # chunks count live rows, at plan time
    for epoch in range(1 if context == "spawn" else 2):  # (spawning workers is slow)
        dataset.set_epoch(epoch)
        batches = batch_ids(load)
        assert Counter(flat(batches)) == Counter(oracle)
        assert len(batches) == len(load)


def test_chunks_count_live_rows(dv_table: tuple[Catalog, list[int]]) -> None:
    catalog, oracle = dv_table
    _, dataset = loader(catalog, "dv")
    live = set(oracle)
    first_of = {v.removeprefix("file://"): k for k, v in _first_ids(catalog.load("dv")).items()}
    groups = []
    for chunk in dataset.plan.chunks:
        first = first_of[chunk.path]
        for group in range(chunk.start, chunk.stop):
            groups.append((first, group))
        end = {0: 500, 500: 750, 750: 800}[first]  # the file's last id + 1
        ids = range(first + chunk.start * 100, min(first + chunk.stop * 100, end))
        assert chunk.num_rows == sum(i in live for i in ids)
    # Row group 2 of the first file (ids 200-299) has no live row: no chunk reads it.
    assert (0, 2) not in groups
    assert len(groups) == 5 - 1 + 3 + 1
    assert sum(c.num_rows for c in dataset.plan.chunks) == len(oracle)


@pytest.fixture
def small_dv(catalog: Catalog) -> tuple[str, str, int]:
    """db.small (format version 3): one data file of ids 0-199 whose vector deletes 3 rows;
    returns the Puffin file (without protocol), the data file URL and the blob's offset."""
    table = catalog.create("small", [range(200)])
    (data_file,) = data_files(table)
    _, puffin, blobs = commit_deletion_vectors(table, {data_file.file_path: [1, 100, 150]})
    upgrade_to_v3(catalog, "small")
    return puffin.removeprefix("file://"), data_file.file_path, blobs[0].offset


def _flip(path: str, offset: int) -> None:
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0xFF
    Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize(("where", "says"), [(4, "CRC-32"), (14, "CRC-32"), (0, "size field says")])
def test_a_corrupt_vector_is_refused(
    catalog: Catalog, small_dv: tuple[str, str, int], where: int, says: str
) -> None:
    puffin, data_file, offset = small_dv
    _, dataset = loader(catalog, "small")  # intact: read
    assert dataset.plan.num_rows == 197
    _flip(puffin, offset + where)  # the length, the magic, the bitmap
    with pytest.raises(CorruptFileError) as raised:
        loader(catalog, "small")
    message = str(raised.value)
    assert puffin in message and data_file in message and says in message


def test_only_the_blob_is_read(catalog: Catalog, small_dv: tuple[str, str, int]) -> None:
    """A broken Puffin footer does not matter: the manifest locates the blob."""
    puffin, _, _ = small_dv
    _flip(puffin, Path(puffin).stat().st_size - 1)  # the closing magic
    load, _ = loader(catalog, "small")
    expected = [i for i in range(200) if i not in {1, 100, 150}]
    assert Counter(flat(batch_ids(load))) == Counter(expected)


def test_other_delete_formats_are_refused(catalog: Catalog) -> None:
    """ORC/Avro position-delete files are still refused, before anything is read."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    from tests.iceberg.conftest import _commit_delete_files

    table = catalog.create("avro", [range(10)])
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=f"{table.metadata.location}/data/deletes.avro",
        file_format=FileFormat.AVRO,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=100,
    )
    _commit_delete_files(table, [delete])
    with pytest.raises(UnsupportedTableError, match="Parquet position-delete files and Puffin"):
        loader(catalog, "avro")


def test_a_vector_entry_must_locate_its_blob(catalog: Catalog) -> None:
    """A Puffin delete file whose manifest entry lacks referenced_data_file, content_offset and
    content_size_in_bytes (a version 2 manifest drops them) is refused, not ignored."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    from tests.iceberg.conftest import _commit_delete_files, write_puffin

    table = catalog.create("nofields", [range(10)])
    (data_file,) = data_files(table)
    puffin, size, _ = write_puffin(table, {data_file.file_path: [3]})
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=puffin,
        file_format=FileFormat.PUFFIN,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=size,
    )
    _commit_delete_files(table, [delete])
    with pytest.raises(CorruptFileError, match="content_offset") as raised:
        loader(catalog, "nofields")
    assert puffin in str(raised.value)


def test_positions_past_2_to_the_32(tmp_path: Path) -> None:
    """A vector of several 32-bit bitmaps (high keys 0, 1 and 3) decodes as pyiceberg's own
    decoder decodes it; a wrong cardinality is a CorruptFileError."""
    from pyiceberg.table.deletion_vector import DeletionVector as PyIcebergVector

    from tests.iceberg.conftest import dv_blob
    from torch_dataloader_utils.fs import FileSystemSpec
    from torch_dataloader_utils.iceberg.deletes import DeletionVector, read_deletion_vector

    positions = [0, 7, 2**32 + 5, 3 * 2**32, 3 * 2**32 + 70000]
    blob = dv_blob(positions)
    path = tmp_path / "v.puffin"
    path.write_bytes(b"PFA1" + blob)
    vector = DeletionVector(str(path), 4, len(blob), "file:///d.parquet", len(positions))
    decoded = read_deletion_vector(vector, FileSystemSpec("file"))
    assert decoded["file:///d.parquet"].tolist() == positions
    bitmaps = PyIcebergVector._deserialize_bitmap(blob[8:-4])
    assert PyIcebergVector._bitmaps_to_chunked_array(bitmaps).to_pylist() == positions
    wrong = DeletionVector(str(path), 4, len(blob), "file:///d.parquet", len(positions) - 1)
    with pytest.raises(CorruptFileError, match="5 deleted rows, the table's manifest says 4"):
        read_deletion_vector(wrong, FileSystemSpec("file"))
