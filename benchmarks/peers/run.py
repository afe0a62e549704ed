"""The peers' side of benchmarks/peers.py, run by it in each peer's virtualenv (setup.sh): one
configuration of Lance, Ray Data or HF ``datasets`` over the same Parquet files, measured with
peers.py's own `measure`; prints one JSON line.

- ``lance``: the files written once with ``lance.write_dataset`` (``--prepare``), then either
  ``mode: scan``, ``lance.torch.data.LanceDataset(uri, batch_size=1024, sampler=...)`` whose
  sampler is lance's ``ShardedBatchSampler(rank, world_size, randomize=True, seed=...)``, with the
  rank and world size of the DataLoader worker that iterates and a new seed each epoch (the
  1024-row ranges of each worker in a new order; the rows inside a range stay in order); or
  ``mode: take``, a map-style dataset whose item is ``lance.dataset(uri).take(indices)`` under
  ``BatchSampler(RandomSampler(...), 1024)``: a full row permutation each epoch. Lance's own
  ``SafeLanceDataset`` does the same per row with ``to_pylist``. Workers are spawned, as Lance's
  docs ask (it is not fork-safe), and persistent.
- ``ray``: ``ray.init(num_cpus=2, object_store_memory=2 GiB)``, ``ray.data.read_parquet(dir)``,
  then each epoch ``mode: local``, ``randomize_block_order(seed)`` and
  ``iter_torch_batches(local_shuffle_buffer_size=buffer_rows)``, or ``mode: full``,
  ``random_shuffle(seed)`` and ``iter_torch_batches``.
- ``hf``: ``load_dataset("parquet", data_files=..., cache_dir=...)`` (its Arrow cache made by
  ``--prepare``), ``.with_format("torch")``, in a ``DataLoader(batch_size=None,
  sampler=BatchSampler(RandomSampler(...), 1024))``: each batch one ``dataset[indices]``, a full
  row permutation each epoch, forked persistent workers. On tokens, ``pad: true`` pads the list
  of token tensors HF gives in the worker (a ``collate_fn``), as ours pads: a list of 1024
  tensors crosses from a worker as 1024 shared-memory tensors, which is very slow.

Lance's and Ray's default tensor conversions refuse the string column and the ragged token lists
(``Only support FixedSizeList...``, ``Numpy array of object dtype cannot be converted``), so both
are given throughput.py's zero-copy conversion (`_raw_convert`, the limit's): strings as Python
lists, lists as values + offsets. HF's torch format gives strings as lists and the token lists as
a list of tensors.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, get_worker_info

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from peers import BATCH_SIZE, SEED, measure
from throughput import _raw_convert

PACKAGES = {"lance": "pylance", "ray": "ray", "hf": "datasets"}


def table_to_tensors(table: pa.Table) -> dict[str, Any]:
    """A table's rows as one batch, converted as the limit converts."""
    batches = table.combine_chunks().to_batches()
    return _raw_convert(batches[0] if batches else table.schema.empty_table().to_batches()[0])


def loader_options(workers: int, *, spawn: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"num_workers": workers, "persistent_workers": workers > 0}
    if workers and spawn:
        options["multiprocessing_context"] = "spawn"
    return options


def batch_sampler(rows: int) -> BatchSampler:
    """Batches of a new random permutation of ``range(rows)`` each epoch."""
    generator = torch.Generator().manual_seed(SEED)
    return BatchSampler(RandomSampler(range(rows), generator=generator), BATCH_SIZE, False)


# --- Lance ---------------------------------------------------------------------------------------


def lance_uri(spec: Mapping[str, Any]) -> Path:
    return Path(spec["work"]) / "lance" / f"{Path(spec['data']).name}.lance"


def lance_prepare(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Write the Parquet files as a Lance dataset, once."""
    import lance
    import pyarrow.dataset as ds

    uri = lance_uri(spec)
    done = uri.with_suffix(".done")
    if done.exists():
        return {"seconds": None}
    uri.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    source = ds.dataset(spec["data"], format="parquet")
    lance.write_dataset(source.scanner(batch_size=65_536), str(uri), mode="overwrite")
    seconds = time.perf_counter() - start
    done.touch()
    return {"seconds": seconds, "what": "lance.write_dataset"}


def lance_to_tensors(batch: pa.RecordBatch, **_: Any) -> dict[str, Any]:
    """LanceDataset's ``to_tensor_fn`` (see the module's docstring)."""
    return _raw_convert(batch)


class EpochRanges:
    """A Lance sampler: lance's ``ShardedBatchSampler(randomize=True)`` for the DataLoader worker
    that iterates (rank = worker id, world size = workers), seeded anew each epoch (each worker
    keeps its own count of its epochs, so this holds with persistent workers)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.epoch = 0

    def __call__(self, dataset: Any, *args: Any, **kwargs: Any) -> Iterable[pa.RecordBatch]:
        from lance.sampler import ShardedBatchSampler

        info = get_worker_info()
        rank, world = (info.id, info.num_workers) if info else (0, 1)
        sampler = ShardedBatchSampler(rank, world, randomize=True, seed=self.seed + self.epoch)
        self.epoch += 1
        kwargs.pop("with_row_id", None)  # it warns that it has none
        return sampler(dataset, *args, **kwargs)  # type: ignore[no-any-return]


class LanceTake(Dataset):  # type: ignore[type-arg]
    """Map-style: item ``indices`` is ``lance.dataset(uri).take(indices)``, converted."""

    def __init__(self, uri: str) -> None:
        import lance

        self.uri = uri
        self.rows = lance.dataset(uri).count_rows()
        self.dataset: Any = None

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, indices: list[int]) -> dict[str, Any]:
        if self.dataset is None:  # opened in the process that reads
            import lance

            self.dataset = lance.dataset(self.uri)
        return table_to_tensors(self.dataset.take(indices))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "dataset": None}


def lance_run(spec: Mapping[str, Any]) -> dict[str, Any]:
    import lance  # noqa: F401  (imported before timing, as a training script would)
    from lance.torch.data import LanceDataset

    uri, workers = str(lance_uri(spec)), spec["workers"]

    def build() -> DataLoader:  # type: ignore[type-arg]
        if spec["mode"] == "scan":
            dataset = LanceDataset(
                uri, BATCH_SIZE, sampler=EpochRanges(SEED), to_tensor_fn=lance_to_tensors
            )
            return DataLoader(dataset, batch_size=None, **loader_options(workers, spawn=True))
        take = LanceTake(uri)
        options = loader_options(workers, spawn=True)
        return DataLoader(take, batch_size=None, sampler=batch_sampler(len(take)), **options)

    return measure(build, lambda loader, e: loader, rows=spec["rows"])


# --- Ray Data ------------------------------------------------------------------------------------


def ray_run(spec: Mapping[str, Any]) -> dict[str, Any]:
    import ray
    from ray.data.collate_fn import ArrowBatchCollateFn

    class Collate(ArrowBatchCollateFn):
        def __call__(self, batch: pa.Table) -> dict[str, Any]:
            return table_to_tensors(batch)

    init = [0.0]

    def build() -> Any:
        start = time.perf_counter()
        ray.init(
            num_cpus=2,
            object_store_memory=2 * 1024**3,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )
        init[0] = time.perf_counter() - start
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        return ray.data.read_parquet(spec["data"])

    def epoch(dataset: Any, e: int) -> Iterable[Mapping[str, Any]]:
        options: dict[str, Any] = {"batch_size": BATCH_SIZE, "collate_fn": Collate()}
        if spec["mode"] == "local":
            dataset = dataset.randomize_block_order(seed=SEED + e)
            options["local_shuffle_buffer_size"] = spec["buffer_rows"]
            options["local_shuffle_seed"] = SEED + e
        else:
            dataset = dataset.random_shuffle(seed=SEED + e)
        return dataset.iter_torch_batches(**options)  # type: ignore[no-any-return]

    try:
        result = measure(build, epoch, rows=spec["rows"])
    finally:
        ray.shutdown()
    buffer = f", {spec['buffer_rows']:,}-row buffer" if spec["mode"] == "local" else ""
    return {**result, "note": f"ray.init {init[0]:.1f} s of the first batch{buffer}"}


# --- HF datasets ---------------------------------------------------------------------------------


def hf_dataset(spec: Mapping[str, Any]) -> Any:
    from datasets import load_dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    files = sorted(str(p) for p in Path(spec["data"]).glob("*.parquet"))
    cache = Path(spec["work"]) / "hf-cache" / Path(spec["data"]).name
    return load_dataset("parquet", data_files=files, split="train", cache_dir=str(cache))


def hf_prepare(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Make load_dataset's Arrow cache, once."""
    fresh = not (Path(spec["work"]) / "hf-cache" / Path(spec["data"]).name).exists()
    start = time.perf_counter()
    hf_dataset(spec)
    seconds = time.perf_counter() - start
    return {"seconds": seconds if fresh else None, "what": "load_dataset's Arrow cache"}


def pad_tokens(batch: dict[str, Any]) -> dict[str, Any]:
    """HF's batch with its list of token tensors padded (0) to the longest, as ours pads; run
    in the worker (the DataLoader's ``collate_fn``)."""
    tokens = batch["tokens"]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.int64)
    return {**batch, "tokens": pad_sequence(tokens, batch_first=True), "tokens_lengths": lengths}


def hf_run(spec: Mapping[str, Any]) -> dict[str, Any]:
    import datasets  # noqa: F401  (imported before timing, as a training script would)

    def build() -> DataLoader:  # type: ignore[type-arg]
        dataset = hf_dataset(spec).with_format("torch")
        options = loader_options(spec["workers"], spawn=False)
        if spec.get("pad"):
            options["collate_fn"] = pad_tokens
        return DataLoader(dataset, batch_size=None, sampler=batch_sampler(len(dataset)), **options)

    return measure(build, lambda loader, e: loader, rows=spec["rows"])


# --- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="peers.py's JSON description of the run")
    parser.add_argument("--check", choices=PACKAGES, help="import the peer, print versions")
    parser.add_argument("--prepare", choices=("lance", "hf"), help="convert --data, once")
    parser.add_argument("--data")
    parser.add_argument("--work")
    args = parser.parse_args()
    if args.check:
        __import__({"lance": "lance.torch.data", "ray": "ray.data", "hf": "datasets"}[args.check])
        names = (PACKAGES[args.check], "torch", "pyarrow", "numpy")
        print(", ".join(f"{n} {importlib.metadata.version(n)}" for n in names))
        return
    if args.prepare:
        spec = {"data": args.data, "work": args.work}
        print(json.dumps((lance_prepare if args.prepare == "lance" else hf_prepare)(spec)))
        return
    spec = json.loads(args.spec)
    run = {"lance": lance_run, "ray": ray_run, "hf": hf_run}[spec["peer"]]
    print(json.dumps(run(spec)))


if __name__ == "__main__":
    main()
