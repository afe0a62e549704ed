"""The peers' side of benchmarks/peers.py, run by it in each peer's virtualenv (setup.sh): one
configuration of Lance, Ray Data, HF ``datasets``, MosaicML Streaming, LitData, Petastorm or Daft
over the same Parquet files, measured with peers.py's own `measure`; prints one JSON line.

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

- ``streaming``: the rows written once with ``MDSWriter`` (``--prepare``; uncompressed, 64 MiB
  shards; numbers as MDS scalars, the string as ``str``, the embedding ``ndarray:float32:64``,
  the tokens ``ndarray:int32``), read with ``StreamingDataset(local=..., shuffle=True,
  shuffle_seed=..., batch_size=1024)`` (``py1e``, its default shuffle) in a torch
  ``DataLoader(batch_size=1024, collate_fn=collate_rows)``. The dataset counts its own epochs.
  ``import streaming`` may need ``streaming.vision`` left out (`import_streaming`), as in
  benchmarks/peers_mixing/run.py.
- ``litdata``: the rows written once with ``litdata.optimize(fn, inputs=row groups,
  chunk_bytes="64MB")`` (``--prepare``), read with ``StreamingDataset(dir, shuffle=True,
  seed=...)`` in ``StreamingDataLoader(batch_size=1024, collate_fn=collate_rows)``, which counts
  the epochs.
- ``petastorm``: ``make_batch_reader("file://dir", shuffle_row_groups=True, seed=...,
  workers_count=2)`` (a thread pool) in ``petastorm.pytorch.BatchedDataLoader(batch_size=1024,
  shuffling_queue_capacity=buffer_rows)``; the reader is reset each epoch. Never run here:
  Petastorm does not install beside torch 2.13 (peers.py's ``INSTALL_NOTES``).
- ``daft``: ``daft.read_parquet(files)``, each epoch ``shuffle(seed=...)`` (a full row
  permutation; Daft's docs: a global sort by a random key), then ``mode: torch``, Daft's own
  ``to_torch_dataloader(batch_size=1024)`` (numbers as tensors, but the embedding and the token
  lists as Python lists of lists, and batches "best-effort": some shorter), or ``mode: arrow``,
  ``to_arrow_iter()``, its record batches cut to 1024 rows (`rebatch`) and converted as the limit
  converts.

Streaming and LitData give the DataLoader one row (a dict) at a time; `collate_rows` makes the
batch: numbers and the embedding stacked, strings a list, token lists padded to the longest, as
ours pads.

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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, get_worker_info

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from peers import BATCH_SIZE, SEED, measure
from peers import PEER_PACKAGES as PACKAGES
from peers_mixing.run import import_streaming
from throughput import _raw_convert

MODULES = {  # what --check imports
    "lance": "lance.torch.data",
    "ray": "ray.data",
    "hf": "datasets",
    "litdata": "litdata",
    "petastorm": "petastorm.pytorch",
    "daft": "daft",
}


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


# --- row by row: MosaicML Streaming and LitData -------------------------------------------------


def rows_of(batch: pa.RecordBatch, *, numpy_scalars: bool = True) -> Iterator[dict[str, Any]]:
    """A record batch's rows as the dicts MDSWriter and litdata.optimize take: numbers as numpy
    scalars (or Python's: LitData pickles numpy scalars), strings as str, a fixed-size list or a
    list as a numpy array (a view)."""
    columns: dict[str, Any] = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        t = col.type
        if pa.types.is_fixed_size_list(t):
            columns[name] = col.flatten().to_numpy().reshape(len(col), t.list_size)
        elif pa.types.is_list(t):
            offsets, values = col.offsets.to_numpy(), col.flatten().to_numpy()
            columns[name] = [values[offsets[i] : offsets[i + 1]] for i in range(len(col))]
        elif pa.types.is_string(t) or not numpy_scalars:
            columns[name] = col.to_pylist()
        else:
            columns[name] = col.to_numpy()
    for i in range(batch.num_rows):
        yield {name: values[i] for name, values in columns.items()}


def collate_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows to one batch: numbers and same-shaped arrays stacked, strings a list, arrays of
    different lengths (the tokens) padded with 0 to the longest, as ours pads."""
    out: dict[str, Any] = {}
    for name, first in rows[0].items():
        values = [r[name] for r in rows]
        if isinstance(first, str):
            out[name] = values
        elif isinstance(first, np.ndarray) and first.ndim and len({len(v) for v in values}) > 1:
            lengths = np.array([len(v) for v in values])
            padded = np.zeros((len(values), lengths.max()), first.dtype)
            padded[np.arange(padded.shape[1]) < lengths[:, None]] = np.concatenate(values)
            out[name] = torch.from_numpy(padded)
        else:
            out[name] = torch.from_numpy(np.stack(values))
    return out


def row_groups(data: str) -> list[tuple[str, int]]:
    """Every (file, row group) of ``data``, in order."""
    files = sorted(str(p) for p in Path(data).glob("*.parquet"))
    return [(f, g) for f in files for g in range(pq.ParquetFile(f).num_row_groups)]


def work_dir(spec: Mapping[str, Any], peer: str) -> Path:
    return Path(spec["work"]) / peer / Path(spec["data"]).name


MDS_TYPES = {"int64": "int64", "int32": "int32", "float": "float32", "double": "float64"}


def mds_columns(schema: pa.Schema) -> dict[str, str]:
    """MDSWriter's column encodings for ``schema``."""
    columns = {}
    for field in schema:
        t = field.type
        if pa.types.is_fixed_size_list(t):
            columns[field.name] = f"ndarray:{t.value_type.to_pandas_dtype().__name__}:{t.list_size}"
        elif pa.types.is_list(t):
            columns[field.name] = f"ndarray:{t.value_type.to_pandas_dtype().__name__}"
        elif pa.types.is_string(t):
            columns[field.name] = "str"
        else:
            columns[field.name] = MDS_TYPES[str(t)]
    return columns


def streaming_prepare(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Write the rows as MDS shards, once."""
    import_streaming()
    from streaming import MDSWriter

    out = work_dir(spec, "mds")
    done = out.with_suffix(".done")
    if done.exists():
        return {"seconds": None}
    start = time.perf_counter()
    schema = pq.read_schema(row_groups(spec["data"])[0][0])
    with MDSWriter(out=str(out), columns=mds_columns(schema), size_limit=1 << 26) as writer:
        for path, group in row_groups(spec["data"]):
            for batch in pq.ParquetFile(path).read_row_group(group).to_batches():
                for row in rows_of(batch):
                    writer.write(row)
    done.touch()
    return {"seconds": time.perf_counter() - start, "what": "MDSWriter"}


def streaming_run(spec: Mapping[str, Any]) -> dict[str, Any]:
    import_streaming()  # what it leaves out, --check says (the table's heading)
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a killed earlier run's

    def build() -> DataLoader:  # type: ignore[type-arg]
        dataset = StreamingDataset(
            local=str(work_dir(spec, "mds")),
            shuffle=True,
            shuffle_seed=SEED,
            batch_size=BATCH_SIZE,
        )
        options = loader_options(spec["workers"], spawn=False)
        return DataLoader(dataset, batch_size=BATCH_SIZE, collate_fn=collate_rows, **options)

    return measure(build, lambda loader, e: loader, rows=spec["rows"])


def litdata_rows(item: tuple[str, int]) -> Iterator[dict[str, Any]]:
    """litdata.optimize's ``fn``: one row group's rows, numbers as Python's (LitData keeps them
    as int and float, so float32 columns come back float64)."""
    path, group = item
    for batch in pq.ParquetFile(path).read_row_group(group).to_batches():
        yield from rows_of(batch, numpy_scalars=False)


def litdata_prepare(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Write the rows in LitData's format with ``optimize``, once."""
    from litdata import optimize

    out = work_dir(spec, "litdata")
    done = out.with_suffix(".done")
    if done.exists():
        return {"seconds": None}
    start = time.perf_counter()
    optimize(
        fn=litdata_rows,
        inputs=row_groups(spec["data"]),
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=2,
        mode="overwrite",
    )
    done.touch()
    return {"seconds": time.perf_counter() - start, "what": "litdata.optimize"}


def litdata_run(spec: Mapping[str, Any]) -> dict[str, Any]:
    from litdata import StreamingDataLoader, StreamingDataset

    def build() -> Any:
        dataset = StreamingDataset(str(work_dir(spec, "litdata")), shuffle=True, seed=SEED)
        workers = spec["workers"]
        return StreamingDataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            collate_fn=collate_rows,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    return measure(build, lambda loader, e: loader, rows=spec["rows"])


# --- Petastorm -----------------------------------------------------------------------------------


def petastorm_run(spec: Mapping[str, Any]) -> dict[str, Any]:
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader

    readers: list[Any] = []

    def build() -> Any:
        reader = make_batch_reader(
            Path(spec["data"]).resolve().as_uri(),
            num_epochs=1,
            shuffle_row_groups=True,
            seed=SEED,
            workers_count=2,
            reader_pool_type="thread",
        )
        readers.append(reader)
        return BatchedDataLoader(
            reader, batch_size=BATCH_SIZE, shuffling_queue_capacity=spec["buffer_rows"]
        )

    def epoch(loader: Any, e: int) -> Any:
        if e:
            readers[0].reset()
        return loader

    try:
        return measure(build, epoch, rows=spec["rows"])
    finally:
        for reader in readers:
            reader.stop()
            reader.join()


# --- Daft ----------------------------------------------------------------------------------------


def rebatch(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Record batches of any sizes cut into batches of ``size`` rows (the last one shorter)."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += batch.num_rows
        if held < size:
            continue
        rows = pa.Table.from_batches(pending).combine_chunks()
        whole = held - held % size
        yield from rows.slice(0, whole).to_batches(max_chunksize=size)
        pending = rows.slice(whole).to_batches() if held > whole else []
        held -= whole
    if held:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]


def daft_run(spec: Mapping[str, Any]) -> dict[str, Any]:
    import daft

    def build() -> Any:
        return daft.read_parquet(sorted(str(p) for p in Path(spec["data"]).glob("*.parquet")))

    def epoch(frame: Any, e: int) -> Iterable[Mapping[str, Any]]:
        shuffled = frame.shuffle(seed=SEED + e)
        if spec["mode"] == "torch":
            yield from shuffled.to_torch_dataloader(batch_size=BATCH_SIZE)
            return
        for batch in rebatch(shuffled.to_arrow_iter(), BATCH_SIZE):
            yield _raw_convert(batch)

    return measure(build, epoch, rows=spec["rows"])


# --- main ----------------------------------------------------------------------------------------


PREPARES = {
    "lance": lance_prepare,
    "hf": hf_prepare,
    "streaming": streaming_prepare,
    "litdata": litdata_prepare,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="peers.py's JSON description of the run")
    parser.add_argument("--check", choices=PACKAGES, help="import the peer, print versions")
    parser.add_argument("--prepare", choices=PREPARES, help="convert --data, once")
    parser.add_argument("--data")
    parser.add_argument("--work")
    args = parser.parse_args()
    if args.check:
        left_out = import_streaming() if args.check == "streaming" else ""
        if args.check != "streaming":
            __import__(MODULES[args.check])
        names = (PACKAGES[args.check], "torch", "pyarrow", "numpy")
        versions = ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)
        print(versions + (f"; {left_out}" if left_out else ""))
        return
    if args.prepare:
        spec = {"data": args.data, "work": args.work}
        print(json.dumps(PREPARES[args.prepare](spec)))
        return
    spec = json.loads(args.spec)
    run = {
        "lance": lance_run,
        "ray": ray_run,
        "hf": hf_run,
        "streaming": streaming_run,
        "litdata": litdata_run,
        "petastorm": petastorm_run,
        "daft": daft_run,
    }[spec["peer"]]
    print(json.dumps(run(spec)))


if __name__ == "__main__":
    main()
