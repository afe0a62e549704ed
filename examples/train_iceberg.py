"""Train a small classifier on an Apache Iceberg table, read by name through its catalog.

Run it from the repository root (needs the ``iceberg`` extra: pyiceberg)::

    python examples/train_iceberg.py                   # a table in a temporary directory
    python examples/train_iceberg.py --dir /tmp/wh     # ... or in (and kept under) /tmp/wh

What it shows:

- A local SQL catalog (SQLite) with a table ``demo.events`` written by pyiceberg: two appends,
  row groups of 1,000 rows, so one data file is split across the DataLoader workers.
- ``IcebergDataset.create_dataloader(table=..., catalog_config=...)``: the same options as for
  Parquet files, plus Iceberg's (``snapshot_id=``, ``as_of=``, ``ref=``, ``from_snapshot_id=``).
  ``filters`` may be a pyarrow expression, a pyiceberg expression or a pyiceberg filter string;
  it prunes data files by their column bounds and filters rows.
- The snapshot is pinned when the loader is built: a commit that lands while training is read
  by the next loader, never in the middle of an epoch. ``dataset.snapshot_id`` says which.
- ``dataset.set_epoch(epoch)`` before each epoch; every row is read once per epoch (the
  example counts the ids it sees and prints the count).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from torch_dataloader_utils import IcebergDataset

FEATURES = [f"x{i}" for i in range(8)]
NUM_CLASSES = 3
CATALOG = "demo_catalog"
TABLE = "demo.events"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="catalog and warehouse folder")
    parser.add_argument("--rows", type=int, default=6_000, help="rows per append (2 appends)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    return parser.parse_args()


def catalog_config(root: Path) -> dict[str, str]:
    """The catalog's properties, as ``pyiceberg.catalog.load_catalog`` takes them."""
    return {
        "name": CATALOG,  # SQL catalogs keep tables per catalog name
        "type": "sql",
        "uri": f"sqlite:///{root}/catalog.db",
        "warehouse": f"file://{root}/warehouse",
    }


def create_table(config: dict[str, str], rows: int, seed: int = 0) -> None:
    """``demo.events``: ``id``, features ``x0``..``x7``, and a ``label`` that is a noisy
    linear function of them; written in two appends (two snapshots)."""
    from pyiceberg.catalog import load_catalog

    properties = {k: v for k, v in config.items() if k != "name"}
    catalog = load_catalog(config["name"], **properties)
    catalog.create_namespace_if_not_exists("demo")
    if catalog.table_exists(TABLE):
        return
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(len(FEATURES), NUM_CLASSES))
    columns: dict[str, pa.Array] = {"id": pa.array([], pa.int64())}
    columns.update({name: pa.array([], pa.float32()) for name in FEATURES})
    columns["label"] = pa.array([], pa.int64())
    table = catalog.create_table(
        TABLE,
        schema=pa.table(columns).schema,
        properties={"write.parquet.row-group-limit": "1000"},
    )
    for part in range(2):
        x = rng.normal(size=(rows, len(FEATURES))).astype(np.float32)
        label = (x @ weights + rng.normal(scale=0.5, size=(rows, NUM_CLASSES))).argmax(axis=1)
        data = {"id": np.arange(part * rows, (part + 1) * rows)}
        data.update({name: x[:, j] for j, name in enumerate(FEATURES)})
        data["label"] = label.astype(np.int64)
        table.append(pa.table(data, schema=table.schema().as_arrow()))


def train(root: Path, args: argparse.Namespace) -> None:
    config = catalog_config(root)
    create_table(config, args.rows)
    loader, dataset = IcebergDataset.create_dataloader(
        table=TABLE,
        catalog_config=config,
        batch_size=args.batch_size,
        num_workers=args.workers,
        shuffle=True,
        columns=["id", *FEATURES, "label"],
    )
    print(
        f"table {TABLE} at snapshot {dataset.snapshot_id}: {dataset.plan.num_rows} rows in "
        f"{len(dataset.plan.chunks)} chunks, {len(loader)} batches per epoch",
        flush=True,
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(len(FEATURES), 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        seen = torch.zeros(dataset.plan.num_rows, dtype=torch.int64)
        total, correct = 0.0, 0
        for step, batch in enumerate(loader):
            x = torch.stack([batch[name] for name in FEATURES], dim=1)
            logits = model(x)
            loss = loss_fn(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(x)
            correct += int((logits.argmax(dim=1) == batch["label"]).sum())
            seen += torch.bincount(batch["id"], minlength=len(seen))
            if step % 10 == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}", flush=True)
        rows = int(seen.sum())
        once = int((seen == 1).sum())
        print(
            f"epoch {epoch}: {rows} rows, each read once: {once == rows == len(seen)}, "
            f"mean loss {total / rows:.4f}, accuracy {correct / rows:.3f}",
            flush=True,
        )


def main() -> None:
    args = parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        train(args.dir.resolve(), args)
        return
    with tempfile.TemporaryDirectory(prefix="tdu-iceberg-") as root:
        train(Path(root), args)


if __name__ == "__main__":
    main()
