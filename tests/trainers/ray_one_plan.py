"""Ray Train (2 CPU workers) resumes a state one process saved, over fixed-size lists and maps.

Run by ``test_ray_one_plan.py``, from the repository (the workers import ``tests`` too):
``PYTHONPATH=. python tests/trainers/ray_one_plan.py --data D --out O``.
The driver reads ``STOP`` batches with a loader of its own and takes its state; it builds a
second loader (planned here, in one process) and passes it and the state in
``train_loop_config``. Each Ray worker loads the state into its copy and reads the rest of
the epoch (every batch's values checked); then the same with a loader it builds itself,
planned over the workers' process group. It writes, for each (``driver``, ``worker``), the
ids and the plan's fingerprint and schema to ``O/rank{r}.json``; the driver writes its ids
and plan to ``O/driver.json``.
"""

from __future__ import annotations

import argparse
import json
from itertools import islice
from pathlib import Path
from typing import Any

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import torch_dataloader_utils as tdu
from tests.nested_data import check_batch

BATCH, SEED, STOP = 8, 13, 5


def build(data: str) -> tdu.TabularDataLoader:
    return tdu.create_dataloader(data, batch_size=BATCH, shuffle=True, shuffle_seed=SEED)


def plan_of(loader: tdu.TabularDataLoader) -> dict[str, str]:
    plan = loader.dataset.plan
    return {"fingerprint": plan.fingerprint, "schema": plan.schema.to_string()}


def resumed(loader: tdu.TabularDataLoader, state: dict[str, Any]) -> dict[str, Any]:
    """The ids ``loader`` reads after loading ``state``, and its plan."""
    loader.load_state_dict(state)
    return {"ids": [i for batch in loader for i in check_batch(batch)], **plan_of(loader)}


def train_loop(config: dict[str, Any]) -> None:
    seen = {
        "driver": resumed(config["loader"], config["state"]),
        # Built here: planned over the process group Ray Train set up (the ranks share it).
        "worker": resumed(build(config["data"]), config["state"]),
    }
    rank = ray.train.get_context().get_world_rank()
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(seen))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    one = build(args.data)
    first = [i for batch in islice(one, STOP) for i in check_batch(batch)]
    state = one.state_dict()
    (args.out / "driver.json").write_text(json.dumps({"ids": first, **plan_of(one)}))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        config = {
            "loader": build(args.data),
            "state": state,
            "data": args.data,
            "out": str(args.out),
        }
        TorchTrainer(
            train_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(storage_path=str(args.out / "ray"), name="one-plan"),
        ).fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
