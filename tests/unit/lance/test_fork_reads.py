"""A forked worker's reads through its reader process (`lance.fork_reads`): the rows pylance
reads, a read stopped early leaving the next one intact, errors named as the library's, a reader
process that died replaced; and which processes count as forked after pylance."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from torch_dataloader_utils import CorruptFileError, StorageError, StorageNotFoundError
from torch_dataloader_utils.lance import fork_reads
from torch_dataloader_utils.lance.fork_reads import ReaderProcess, forked_after_lance, read_forked

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning"),
]


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("fork-reads") / "f.lance")
    lance.write_dataset(pa.table({"id": list(range(500))}), path, max_rows_per_file=250)
    lance.dataset(path).delete("id % 2 = 1")  # version 2: fragment 1's live row k is 250 + 2k
    return path


def _request(uri: str, **changes: object) -> dict[str, object]:
    base = {"uri": uri, "version": 2, "fragment": 1, "columns": ["id"], "batch_rows": 16}
    return {**base, "offset": 10, "limit": 50, **changes}


def test_reads_stop_early_fail_and_restart(uri: str) -> None:
    reader = ReaderProcess()
    try:
        batches = list(reader.read(_request(uri), "here"))
        assert pa.Table.from_batches(batches)["id"].to_pylist() == list(range(270, 370, 2))
        assert all(b.num_rows <= 16 for b in batches)
        # Stopped after one batch: the rest of its answer is read and dropped.
        first = list(islice(reader.read(_request(uri), "here"), 1))
        assert first[0]["id"].to_pylist()[0] == 270
        again = list(reader.read(_request(uri, offset=0, limit=2), "here"))
        assert again[0]["id"].to_pylist() == [250, 252]
        with pytest.raises(CorruptFileError, match="here: cannot be read: LookupError"):
            list(reader.read(_request(uri, fragment=5), "here"))
        with pytest.raises(StorageNotFoundError, match=r"here: .*not found"):
            list(reader.read(_request(uri, version=9), "here"))
        process = reader._started()
        process.kill()
        process.wait()
        # A dead process is replaced before the next request (the dead one's answer is lost).
        assert len(list(reader.read(_request(uri), "here"))) == 4
    finally:
        reader.close()
    reader.close()  # (twice: nothing to stop)


@pytest.fixture(scope="module")
def wide_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Rows of 16 KiB: an answer of 200 of them (3.2 MiB) never fits in the pipe, so the reader
    process is still writing it when it is killed (50 small rows fitted, and a loaded machine
    let it write them all first)."""
    path = str(tmp_path_factory.mktemp("fork-reads-wide") / "w.lance")
    blob = b"x" * 16_384
    lance.write_dataset(pa.table({"id": list(range(200)), "blob": [blob] * 200}), path)
    return path


def test_a_reader_process_that_dies_mid_answer_is_a_storage_error(wide_uri: str) -> None:
    reader = ReaderProcess()
    try:
        request = {"uri": wide_uri, "version": 1, "fragment": 0, "columns": ["id", "blob"]}
        answer = reader.read({**request, "batch_rows": 1, "offset": 0, "limit": 200}, "here")
        next(answer)
        reader._started().kill()
        with pytest.raises(StorageError, match="here: this worker's Lance reader process exited"):
            list(answer)
    finally:
        reader.close()


def test_a_child_forked_after_pylance_knows_it() -> None:
    assert not forked_after_lance()
    pid = os.fork()
    if pid == 0:  # the child calls no pylance, only looks at the flag
        os._exit(0 if forked_after_lance() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_reads_in_flight_each_get_a_reader_process_kept_for_later(uri: str) -> None:
    readers = fork_reads._readers.get()
    try:
        a = read_forked(_request(uri, batch_rows=5), "a")
        b = read_forked(_request(uri, offset=0, limit=4, batch_rows=2), "b")
        heads = [next(a), next(b)]  # interleaved: one reader process each
        got_a = pa.Table.from_batches([heads[0], *a])["id"].to_pylist()
        got_b = pa.Table.from_batches([heads[1], *b])["id"].to_pylist()
        assert got_a == list(range(270, 370, 2)) and got_b == [250, 252, 254, 256]
        kept = list(readers._idle)
        assert len(kept) == 2
        assert len(list(read_forked(_request(uri), "c"))) == 4
        assert sorted(map(id, readers._idle)) == sorted(map(id, kept))  # reused, none new
    finally:
        for reader in readers._idle:
            reader.close()
        readers._idle.clear()


def test_the_reader_process_reads_with_the_workers_pylance(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module named lance in the current directory is not what the reader process imports.
    (tmp_path / "lance.py").write_text("raise ImportError('the wrong lance')\n")
    monkeypatch.chdir(tmp_path)
    reader = ReaderProcess()
    try:
        assert len(list(reader.read(_request(uri), "here"))) == 4
    finally:
        reader.close()
