"""Train with Ray Train's TorchTrainer on Parquet: 2 CPU workers, checkpoint mid-epoch, resume.

Run it from the repository root::

    python examples/train_ray.py
    python examples/train_ray.py --packed    # packed sequences of token documents

What it shows:

- The loader is built once in the driver (planned once) and passed in ``train_loop_config``;
  each Ray worker's copy finds its rank in the process group Ray Train sets up.
- ``prepare_data_loader(loader)`` as Ray's docs show it: our loader already reads only this
  rank's share, so Ray adds no sampler; with its default ``move_to_device=True`` Ray wraps the
  loader in a reader that fetches one batch ahead, which the loader's state leaves out (the
  wrapper's ``state_dict()`` is the loader's).
- The loader's ``state_dict()`` goes into the checkpoint; a second run resumes from it exactly.
- ``--packed``: the same over ``packing=tdu.Packing(...)``: Ray's wrapper moves the packed
  batch (a dict of tensors, ``max_seqlen`` an int) as it is; every token once.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.train
import ray.train.torch
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import torch_dataloader_utils as tdu

ROWS = 2_000
DOCUMENTS, SEQ_LEN, PAD = 240, 16, -1  # --packed: documents of 0-29 tokens


def write_data(data: Path, packed: bool) -> None:
    """Four Parquet files: ``ROWS`` ids, or (``packed``) ``DOCUMENTS`` documents of token ids
    that are unique (so reads can be checked)."""
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    token = 0
    for i, ids in enumerate(np.array_split(np.arange(DOCUMENTS if packed else ROWS), 4)):
        columns: dict[str, Any] = {"id": ids}
        if packed:
            documents = []
            for n in rng.integers(0, 30, len(ids)).tolist():
                documents.append(list(range(token, token + n)))
                token += n
            columns["tokens"] = pa.array(documents, pa.list_(pa.int64()))
        pq.write_table(pa.table(columns), data / f"part-{i}.parquet", row_group_size=100)


def train_loop(config: dict[str, Any]) -> None:
    loader: tdu.TabularDataLoader = config["loader"]
    # Ray's default: a wrapper that fetches one batch ahead (and moves batches to the device).
    loader = ray.train.torch.prepare_data_loader(loader)
    rank = ray.train.get_context().get_world_rank()
    start = config.get("checkpoint")  # a Checkpoint of an earlier run
    if start is not None:
        with start.as_directory() as d:
            loader.load_state_dict(torch.load(Path(d, "loader.pt")))
    seen: list[dict[str, Any]] = []
    step = 0
    for _ in range(config["epochs"]):
        for batch in loader:  # no set_epoch: each pass reads the next epoch
            ids = batch["input_ids"] if "input_ids" in batch else batch["id"]  # (packed or not)
            ids = ids[ids != PAD].tolist()
            seen.append({"epoch": loader.dataset.epoch, "step": step, "ids": ids})
            step += 1
            if step == config["stop_at"]:
                break
        else:
            continue
        break
    state = loader.state_dict()
    Path(config["out"], f"{config['tag']}-rank{rank}.json").write_text(json.dumps(seen))
    with tempfile.TemporaryDirectory() as d:
        torch.save(state, Path(d, "loader.pt"))
        ray.train.report({"steps": step}, checkpoint=Checkpoint.from_directory(d))


def run(loader: tdu.TabularDataLoader, out: Path, tag: str, **config: Any) -> Checkpoint | None:
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"loader": loader, "out": str(out), "tag": tag, **config},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=str(out / "ray"), name=tag),
    )
    return trainer.fit().checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp()))
    parser.add_argument("--packed", action="store_true", help="packed sequences of tokens")
    args = parser.parse_args()
    data = args.out / "data"
    write_data(data, args.packed)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        if args.packed:
            packing = tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=PAD)
            options: dict[str, Any] = {"packing": packing, "batch_size": 3}
        else:
            options = {"batch_size": 50}
        loader = tdu.create_dataloader(str(data), shuffle=True, num_workers=1, **options)
        checkpoint = run(loader, args.out, "first", epochs=2, stop_at=7)
        run(loader, args.out, "second", epochs=2, stop_at=0, checkpoint=checkpoint)
    finally:
        ray.shutdown()
    print(f"wrote first-rank*.json and second-rank*.json to {args.out}")


if __name__ == "__main__":
    main()
