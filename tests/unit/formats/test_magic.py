"""Telling formats by their bytes (`formats.magic`): files made by each writer are recognised,
and text is not taken for binary. (Reading a file as the wrong format is a bad-input case: it
runs in the corpus, `tests/corpus/bad_input.py`.)"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.orc as orc
import pyarrow.parquet as pq

from torch_dataloader_utils.formats.magic import HEAD_BYTES, TAIL_BYTES, looks_like

TABLE = pa.table({"id": list(range(50)), "s": [f"v{i}" for i in range(50)]})


def _kind(path: Path) -> str | None:
    data = path.read_bytes()
    return looks_like(data[:HEAD_BYTES], data[-TAIL_BYTES:])


def test_each_writer_is_recognised(tmp_path: Path) -> None:
    pq.write_table(TABLE, tmp_path / "a.parquet")
    orc.write_table(TABLE, tmp_path / "a.orc")
    with ipc.new_file(str(tmp_path / "a.arrow"), TABLE.schema) as writer:
        writer.write_table(TABLE)
    with ipc.new_stream(str(tmp_path / "s.arrows"), TABLE.schema) as writer:
        writer.write_table(TABLE)
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        info = tarfile.TarInfo("000.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    pacsv.write_csv(TABLE, tmp_path / "a.csv")
    (tmp_path / "a.jsonl").write_text('{"id": 1, "s": "é"}\n')
    (tmp_path / "a.gz").write_bytes(gzip.compress(b"id\n1\n"))
    assert _kind(tmp_path / "a.parquet") == "Parquet"
    assert _kind(tmp_path / "a.orc") == "ORC"
    assert _kind(tmp_path / "a.arrow") == "Arrow IPC"
    assert _kind(tmp_path / "s.arrows") == "Arrow IPC"
    assert _kind(tmp_path / "a.tar") == "a tar archive"
    assert _kind(tmp_path / "a.csv") == "CSV/JSON text"
    assert _kind(tmp_path / "a.jsonl") == "CSV/JSON text"
    assert _kind(tmp_path / "a.gz") == "gzip-compressed data"


def test_text_that_starts_like_a_magic_is_text() -> None:
    assert looks_like(b"ORCID,name\n1,a\n", b"ORCID,name\n1,a\n") == "CSV/JSON text"
    assert looks_like(b"PAR1,x\n1,2\n", b"PAR1,x\n1,2\n") == "CSV/JSON text"
    assert looks_like(b"\x00\x01\x02", b"\x00\x01\x02") is None
