"""Orders and states pinned from `main` before the house was rebuilt (issue 42): the same data
read the same way gives the same batches, in the same order, and a state saved then resumes now
to the same rest of the epoch. The data is written afresh with fixed bytes, names and times, so
plans (and their fingerprints) are those of the day the orders were recorded.

Record again only on purpose (an order meant to change, with an ADR saying why):
``python -m tests.multiproc.test_pinned_orders``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

PINNED = Path(__file__).with_name("pinned_orders.json")
MTIME = 1_700_000_000  # every file's modification time: part of a local file's identity
SAVE_AFTER = 3  # batches of epoch 1 read before the state is saved


def _touch(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        os.utime(path, (MTIME, MTIME))


def _write(root: Path) -> dict[str, Path]:
    """Every dataset the scenarios read, under ``root``."""
    out: dict[str, Path] = {}
    rng = np.random.default_rng(42)
    tab = out["table"] = root / "table"
    tab.mkdir()
    for f in range(3):
        ids = np.arange(f * 300, f * 300 + 300, dtype=np.int64)
        pq.write_table(
            pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32)}),
            tab / f"part-{f}.parquet",
            row_group_size=37,
        )
    docs = out["docs"] = root / "docs"
    docs.mkdir()
    doc = token = 0
    for f in range(3):
        rows: list[list[int]] = []
        for _ in range(60):
            n = int(rng.integers(1, 30))
            rows.append(list(range(token, token + n)))
            token += n
        ids = np.arange(doc, doc + len(rows), dtype=np.int64)
        doc += len(rows)
        table = pa.table({"tokens": pa.array(rows, pa.list_(pa.int64())), "id": ids})
        pq.write_table(table, docs / f"part-{f}.parquet", row_group_size=11)
    for s, (name, rows) in enumerate((("web", 400), ("code", 200))):
        src = out[name] = root / name
        src.mkdir()
        for f in range(2):
            ids = np.arange(rows // 2) + rows // 2 * f + 10_000 * s
            pq.write_table(pa.table({"id": ids}), src / f"part-{f}.parquet", row_group_size=23)
    text = out["csv"] = root / "csv"
    text.mkdir()
    for f in range(2):
        ids = np.arange(f * 500, f * 500 + 500, dtype=np.int64)
        pacsv.write_csv(
            pa.table({"id": ids, "name": [f"row-{i}" for i in ids]}), text / f"part-{f}.csv"
        )
    shards = out["tar"] = root / "tar"
    shards.mkdir()
    with tdu.ShardWriter(str(shards / "train-%03d.tar"), maxcount=40) as sink:
        for i in range(150):
            sink.write({"__key__": f"{i:06d}", "cls": i})
    _touch(root)
    return out


def _packing(method: str) -> tdu.Packing:
    return tdu.Packing("tokens", 16, pad_value=-1, method=method)


def _loader(data: Path | list[tdu.Source], rank: int, world_size: int, **options: Any) -> Any:
    """A shuffled loader of ``data`` for ``rank`` of ``world_size``, read in-process unless
    ``options`` say otherwise."""
    options = {"shuffle": True, "num_workers": 0, **options}
    source = data if isinstance(data, list) else str(data)
    return tdu.create_dataloader(source, rank=rank, world_size=world_size, **options)


def _csv(d: dict[str, Path], r: int, w: int, **format_options: int) -> Any:
    return _loader(
        d["csv"], r, w, format="csv", format_options=format_options, batch_size=16, shuffle_seed=8
    )


def _mixed(d: dict[str, Path], weight: float | None) -> list[tdu.Source]:
    return [tdu.Source(str(d["web"]), weight=weight), tdu.Source(str(d["code"]))]


# name -> (what it reads of the data, its options besides shuffling), world size
SCENARIOS: dict[str, tuple[Callable[[dict[str, Path]], Any], dict[str, Any], int]] = {
    "parquet": (lambda d: d["table"], {"batch_size": 16, "shuffle_seed": 5}, 2),
    "parquet_workers": (
        lambda d: d["table"],
        {"batch_size": 10, "shuffle_seed": 9, "num_workers": 2, "multiprocessing_context": "fork"},
        2,
    ),
    "parquet_split_rows": (
        lambda d: d["table"],
        {"batch_size": 8, "shuffle_seed": 1, "split_rows": 50, "drop_last": True},
        3,
    ),
    "packed_concat": (
        lambda d: d["docs"],
        {"packing": _packing("concat"), "batch_size": 3, "shuffle_seed": 2},
        2,
    ),
    "packed_best_fit": (
        lambda d: d["docs"],
        {"packing": _packing("best_fit"), "batch_size": 3, "shuffle_seed": 2},
        2,
    ),
    "token_budget": (
        lambda d: d["docs"],
        {"batching": tdu.TokenBudget("tokens", max_tokens=64), "shuffle_seed": 4},
        2,
    ),
    "mixture_schedule": (
        lambda d: _mixed(d, None),
        {
            "epoch_rows": 240,
            "batch_size": 8,
            "shuffle_seed": 6,
            "mixing": "stratified",
            "weights_schedule": [(0, [3, 1]), (5, [1, 1]), (13, [0, 1])],
        },
        2,
    ),
    "mixture_random": (lambda d: _mixed(d, 2), {"batch_size": 8, "shuffle_seed": 7}, 1),
    "csv_blocks": (
        lambda d: d["csv"],
        {
            "format": "csv",
            "format_options": {"chunk_bytes": 2048},
            "batch_size": 16,
            "shuffle_seed": 8,
        },
        2,
    ),
    "webdataset": (
        lambda d: d["tar"],
        {"format": "webdataset", "batch_size": 8, "shuffle_seed": 3},
        2,
    ),
}


def _make(data: dict[str, Path], name: str, rank: int) -> Any:
    """Scenario ``name``'s loader for ``rank``."""
    reads, options, world_size = SCENARIOS[name]
    return _loader(reads(data), rank, world_size, **options)


def _value(v: Any) -> Any:
    return v.tolist() if hasattr(v, "tolist") else v


def _batch(batch: Any) -> dict[str, Any]:
    # (a shard's URL names the temporary folder the data was written to)
    return {k: _value(v) for k, v in sorted(batch.items()) if k != "__url__"}


def _digest(batches: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(batches, sort_keys=True).encode()).hexdigest()[:20]


def _ids(batches: list[dict[str, Any]]) -> list[Any]:
    return [b.get("id", b.get("__key__")) for b in batches]


def _observe(data: dict[str, Path], name: str) -> Iterator[tuple[str, Any]]:
    """What a scenario reads on each rank: epoch 0 and 1 (digests and the first batches' ids),
    a state saved after `SAVE_AFTER` batches of epoch 1 and the rest of that epoch."""
    world_size = SCENARIOS[name][2]
    for rank in range(world_size):
        loader = _make(data, name, rank)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = [_batch(b) for b in loader]
            yield (
                f"{name}/rank{rank}/epoch{epoch}",
                {
                    "batches": len(batches),
                    "digest": _digest(batches),
                    "first": _ids(batches[:2]),
                },
            )
        loader.set_epoch(1)
        it = iter(loader)
        for _ in range(SAVE_AFTER):
            next(it)
        state = loader.state_dict()
        del it
        rest = [_batch(b) for b in _rest(_make(data, name, rank), state)]
        yield (
            f"{name}/rank{rank}/resume",
            {
                "state": json.loads(json.dumps(state)),
                "rest": _digest(rest),
                "first": _ids(rest[:1]),
            },
        )


def _rest(loader: Any, state: dict[str, Any]) -> Iterator[Any]:
    loader.load_state_dict(state)
    yield from loader


@contextlib.contextmanager
def _root() -> Iterator[Path]:
    """A folder whose path has the same length on every machine: a WebDataset sample's
    ``__url__`` counts in its estimated bytes, so in its shuffle blocks' rows."""
    root = tempfile.mkdtemp(prefix="tdu-pinned-", dir="/tmp")
    try:
        yield Path(root)
    finally:
        shutil.rmtree(root)


@pytest.fixture(scope="module")
def data() -> Iterator[dict[str, Path]]:
    with _root() as root:
        yield _write(root)


@pytest.fixture(scope="module")
def pinned() -> dict[str, Any]:
    return json.loads(PINNED.read_text())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_orders_and_states_are_those_pinned(
    data: dict[str, Path], pinned: dict[str, Any], name: str
) -> None:
    world_size = SCENARIOS[name][2]
    keys = [k for k in pinned if k.startswith(f"{name}/")]
    assert len(keys) == 3 * world_size
    for key, seen in _observe(data, name):
        want = pinned[key]
        if key.endswith("/resume"):
            # the state pinned then resumes now to the rest pinned then
            rank = int(key.split("/")[1][4:])
            rest = [_batch(b) for b in _rest(_make(data, name, rank), want["state"])]
            assert (_digest(rest), _ids(rest[:1])) == (want["rest"], want["first"]), key
            # and the state saved now is the one saved then
            assert seen["state"] == want["state"], key
        else:
            assert seen == want, key


def test_block_bytes_the_earlier_name_of_chunk_bytes_reads_the_pinned_order(
    data: dict[str, Path], pinned: dict[str, Any]
) -> None:
    """``format_options={"block_bytes": ...}``, the name ``chunk_bytes`` had when the orders
    were pinned, still cuts the same chunks, so reads the same order, and says it is
    deprecated."""
    for rank in range(2):
        with pytest.warns(DeprecationWarning, match="block_bytes= is deprecated.*chunk_bytes="):
            loader = _csv(data, rank, 2, block_bytes=2048)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = [_batch(b) for b in loader]
            want = pinned[f"csv_blocks/rank{rank}/epoch{epoch}"]
            assert (len(batches), _digest(batches), _ids(batches[:2])) == (
                want["batches"],
                want["digest"],
                want["first"],
            )


def _record(root: Path) -> None:
    data = _write(root)
    found: dict[str, Any] = {}
    for name in sorted(SCENARIOS):
        found.update(_observe(data, name))
    PINNED.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"{len(found)} observations written to {PINNED}", file=sys.stderr)


if __name__ == "__main__":
    with _root() as folder:
        _record(folder)
