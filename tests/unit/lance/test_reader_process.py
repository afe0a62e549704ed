"""The reader process's loop (`lance.reader_process.serve`), run here on in-memory streams:
each request answered by its batches then an end frame, or by an error frame, in order."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa

from torch_dataloader_utils.lance.reader_process import serve


def _frames(data: bytes) -> list[tuple[str, Any]]:
    stream, out = io.BytesIO(data), []
    while stream.tell() < len(data):
        out.append(pickle.load(stream))
    return out


def test_requests_are_answered_in_order(tmp_path: Path) -> None:
    uri = str(tmp_path / "r.lance")
    lance.write_dataset(pa.table({"id": list(range(100)), "x": [0.5] * 100}), uri)
    lance.dataset(uri).delete("id < 10")  # version 2: live row 0 is id 10
    base = {"uri": uri, "fragment": 0, "columns": ["id"], "batch_rows": 7}
    requests = io.BytesIO()
    for request in (
        {**base, "version": 2, "offset": 5, "limit": 20},
        {**base, "version": 1, "offset": 0, "limit": 3},
        {**base, "version": 2, "fragment": 9, "offset": 0, "limit": 3},
        {**base, "version": 7, "offset": 0, "limit": 3},
    ):
        pickle.dump(request, requests)
    requests.seek(0)
    out = io.BytesIO()
    serve(requests, out)
    frames = _frames(out.getvalue())
    kinds = [kind for kind, _ in frames]
    assert kinds == ["batch", "batch", "batch", "end", "batch", "end", "error", "error"]
    first = pa.Table.from_batches([value for _, value in frames[:3]])
    assert first.column_names == ["id"] and first["id"].to_pylist() == list(range(15, 35))
    assert frames[4][1]["id"].to_pylist() == [0, 1, 2]
    assert frames[6][1] == ("LookupError", "no fragment 9 at version 2")
    assert frames[7][1][0] == "ValueError" and "not found" in frames[7][1][1]
