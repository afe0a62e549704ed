"""The conformance suites on ORC and Arrow IPC (the `Format` contract and the loader's resume
contract), and real DataLoader workers (fork and spawn) reading them, one big file included."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torch_dataloader_utils as tdu
from tests.format_files import ipc_table, write_ipc, write_orc, write_orc_ipc_source
from torch_dataloader_utils import Topology
from torch_dataloader_utils.formats.ipc import IpcFormat
from torch_dataloader_utils.formats.orc import OrcFormat
from torch_dataloader_utils.testing import check_elastic_resume, check_format, check_resume

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

# (rows, rows per stripe or record batch) per file: uneven files and units, an empty file.
FILES = [(170, 64), (0, 10), (512, 100), (300, 7), (18, 5)]
ROWS = 1000


@pytest.fixture(params=["orc", "ipc"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    fmt: str = request.param
    return fmt, write_orc_ipc_source(tmp_path / "data", fmt, FILES)


def test_orc_format_contract(tmp_path: Path) -> None:
    root = write_orc_ipc_source(tmp_path / "data", "orc", FILES)
    # a compressed file too: a whole file in one stripe, its tail zstd-compressed
    write_orc(root / "p9.orc", np.arange(ROWS, ROWS + 40), compression="zstd")
    check_format(OrcFormat(), str(root), id_column="id", columns=["name", "x", "id"])


def test_ipc_file_format_contract(tmp_path: Path) -> None:
    root = tmp_path / "data"
    start = 0
    for i, (rows, unit) in enumerate(FILES):
        write_ipc(root / f"p{i}.arrow", np.arange(start, start + rows), batch_rows=unit)
        start += rows
    check_format(IpcFormat(), str(root), id_column="id", columns=["kind", "id"])


def test_ipc_streams_and_files_contract(tmp_path: Path) -> None:
    # pyarrow.dataset reads no IPC streams: the expected rows are given.
    root = write_orc_ipc_source(tmp_path / "data", "ipc", FILES)
    check_format(IpcFormat(), str(root), id_column="id", expected=ipc_table(np.arange(ROWS)))


# --- the resume suite --------------------------------------------------------------------------


def loader(root: Path, fmt: str, **options: Any) -> tdu.TabularDataLoader:
    options = {"batch_size": 45, "shuffle_seed": 3, "shuffle_block_size": 150, **options}
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)  # a stuck worker fails the test instead of hanging it
    return tdu.create_dataloader(root, format=fmt, **options)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_suite(source: tuple[str, Path], num_workers: int) -> None:
    fmt, root = source
    check_resume(
        lambda: loader(root, fmt, shuffle=True, num_workers=num_workers),
        expected_ids=range(ROWS),
    )


def test_elastic_resume_suite(source: tuple[str, Path]) -> None:
    fmt, root = source

    def make(rank: int, world_size: int, num_workers: int) -> tdu.TabularDataLoader:
        return loader(
            root, fmt, shuffle=True, rank=rank, world_size=world_size, num_workers=num_workers
        )

    check_elastic_resume(make, old=(2, 1), new=(3, 0), batches=4, epoch=1)


# --- real workers -------------------------------------------------------------------------------


def ids_of(batches: list[Any]) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_workers_read_every_row_once_per_shuffled_epoch(
    source: tuple[str, Path], context: str
) -> None:
    fmt, root = source
    shuffled = loader(  # persistent: spawn starts its workers (importing torch) once
        root,
        fmt,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=True,
        columns=["id"],
    )
    orders = []
    for epoch in range(2):
        shuffled.set_epoch(epoch)
        ids = ids_of(list(shuffled))
        assert Counter(ids) == Counter(range(ROWS)), f"epoch {epoch}"
        orders.append(ids)
    assert orders[0] != orders[1]  # the epochs are shuffled differently


@pytest.mark.parametrize("fmt", ["orc", "ipc"])
def test_one_big_file_feeds_both_workers(tmp_path: Path, fmt: str) -> None:
    rows = 5000
    root = write_orc_ipc_source(tmp_path / "big", fmt, [(rows, 250)])
    shuffled = loader(root, fmt, shuffle=True, num_workers=2, batch_size=100)
    dataset = shuffled.dataset
    assert len(dataset.plan.chunks) == 20 and len({c.path for c in dataset.plan.chunks}) == 1
    for worker in range(2):  # the assignment gives each worker about half the file
        pieces = dataset.pieces(Topology(worker=worker, num_workers=2), 0)
        assert sum(p.num_rows for p in pieces) == rows // 2
    batches = list(shuffled)
    assert Counter(ids_of(batches)) == Counter(range(rows))
    # The DataLoader takes batches from its workers in turn: both delivered rows.
    by_worker = [ids_of(batches[w::2]) for w in range(2)]
    assert all(len(ids) == rows // 2 for ids in by_worker)
