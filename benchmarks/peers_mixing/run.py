"""The peers' side of benchmarks/mixing.py, run by it in the peers' virtualenv (setup.sh): one
configuration of HF ``datasets`` or MosaicML Streaming over the same Parquet sources, measured
with mixing.py's own `measure`; prints one JSON line.

- ``--peer hf``: each source ``load_dataset("parquet", data_files=...)`` (an Arrow cache under
  the data's folder, made once), shuffled, then ``interleave_datasets(probabilities=weights,
  stopping_strategy="all_exhausted")`` (a smaller source repeats), its first ``epoch_rows``
  rows, in a torch ``DataLoader(shuffle=True)`` with ``with_format("torch")``.
- ``--peer streaming``: each source converted once with ``MDSWriter`` (uncompressed), then
  ``StreamingDataset(streams=[Stream(local=..., proportion=w / sum(w))], epoch_size=epoch_rows,
  shuffle=True, batch_size=..., batching_method=mixing)`` in a torch ``DataLoader``.

Both collate rows as ours pads: ``id`` and ``x`` stacked, ``tokens`` padded to the batch's
longest. Workers are persistent, as ours.

``import streaming`` imports ``streaming.vision``, which imports torchvision; PyPI's torchvision
wheels are built against the CUDA torch, and with the CPU torch installed here their ops fail to
load (``operator torchvision::nms does not exist``). When that import fails, `import_streaming`
puts an empty module in place of ``streaming.vision`` (its image datasets, unused here) and says
so in the output; nothing that is measured changes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mixing import SEED, measure


def collate(rows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Rows to one batch, as ours delivers it (tokens padded with 0 to the longest)."""
    return {
        "id": torch.as_tensor(np.array([int(r["id"]) for r in rows], dtype=np.int64)),
        "x": torch.stack([torch.as_tensor(r["x"]) for r in rows]),
        "tokens": pad_sequence([torch.as_tensor(r["tokens"]) for r in rows], batch_first=True),
    }


def loader_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    workers = spec["workers"]
    return {
        "batch_size": spec["batch_size"],
        "num_workers": workers,
        "persistent_workers": workers > 0,
        "collate_fn": collate,
    }


def hf(spec: Mapping[str, Any]) -> tuple[DataLoader, dict[str, Any]]:
    from datasets import interleave_datasets, load_dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    cache = Path(spec["work"]) / "hf-cache"
    fresh = not cache.exists()
    start = time.perf_counter()
    sources = [
        load_dataset(
            "parquet",
            data_files=sorted(str(p) for p in Path(d).glob("*.parquet")),
            split="train",
            cache_dir=str(cache),
        )
        for d in spec["dirs"]
    ]
    loaded = time.perf_counter() - start
    total = sum(spec["weights"])
    mixed = interleave_datasets(
        [s.shuffle(seed=SEED + k) for k, s in enumerate(sources)],
        probabilities=[w / total for w in spec["weights"]],
        seed=SEED,
        stopping_strategy="all_exhausted",
    )
    mixed = mixed.select(range(min(spec["epoch_rows"], len(mixed)))).with_format("torch")
    info = {"setup_s": round(time.perf_counter() - start, 2)}
    if fresh:
        info["prepare_s"] = f"load_dataset's Arrow cache in {loaded:.1f} s"
    generator = torch.Generator().manual_seed(SEED)
    loader = DataLoader(mixed, shuffle=True, generator=generator, **loader_options(spec))
    return loader, info


def to_mds(source: Path, out: Path) -> None:
    """Write one source's rows as MDS shards (uncompressed), once."""
    from streaming import MDSWriter

    columns = {"id": "int64", "x": "ndarray:float32", "tokens": "ndarray:int32"}
    with MDSWriter(out=str(out), columns=columns, size_limit=1 << 26) as writer:
        for path in sorted(source.glob("*.parquet")):
            for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
                ids = batch.column("id").to_numpy()
                x = batch.column("x").flatten().to_numpy().reshape(len(ids), -1)
                tokens = batch.column("tokens")
                offsets = tokens.offsets.to_numpy()
                values = tokens.flatten().to_numpy()
                for i in range(len(ids)):
                    writer.write(
                        {"id": ids[i], "x": x[i], "tokens": values[offsets[i] : offsets[i + 1]]}
                    )


def import_streaming() -> str:
    """Import streaming; returns '' or what had to be left out (see the module's docstring)."""
    try:
        import streaming
    except (ImportError, RuntimeError, OSError) as exc:
        for name in [n for n in sys.modules if n.split(".")[0] in ("streaming", "torchvision")]:
            del sys.modules[name]
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
        import streaming  # noqa: F401

        return f"streaming.vision left out ({type(exc).__name__}: {exc})"
    return ""


def streaming(spec: Mapping[str, Any]) -> tuple[DataLoader, dict[str, Any]]:
    left_out = import_streaming()
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    info: dict[str, Any] = {"note": left_out} if left_out else {}
    root = Path(spec["work"]) / "mds"
    start = time.perf_counter()
    for k, d in enumerate(spec["dirs"]):
        out = root / f"src{k}"
        if not (out / "_done").exists():
            to_mds(Path(d), out)
            (out / "_done").touch()
            info["prepare_s"] = f"MDSWriter conversion in {time.perf_counter() - start:.1f} s"
    total = sum(spec["weights"])
    streams = [
        Stream(local=str(root / f"src{k}"), proportion=w / total)
        for k, w in enumerate(spec["weights"])
    ]
    dataset = StreamingDataset(
        streams=streams,
        epoch_size=spec["epoch_rows"],
        shuffle=True,
        shuffle_seed=SEED,
        batch_size=spec["batch_size"],
        batching_method=spec["mixing"],
    )
    return DataLoader(dataset, **loader_options(spec)), info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=["hf", "streaming"], required=True)
    parser.add_argument("--spec", help="mixing.py's JSON description of the run")
    parser.add_argument("--check", action="store_true", help="import the peer, print versions")
    args = parser.parse_args()
    if args.check:
        if args.peer == "hf":
            import datasets  # noqa: F401

            left_out = ""
        else:
            left_out = import_streaming()
        package = "datasets" if args.peer == "hf" else "mosaicml-streaming"
        names = (package, "torch", "pyarrow", "numpy")
        versions = ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)
        print(versions + (f"; {left_out}" if left_out else ""))
        return
    spec = json.loads(args.spec)
    loader, info = (hf if args.peer == "hf" else streaming)(spec)

    def epoch(e: int) -> Iterable[Mapping[str, Any]]:
        return loader

    print(json.dumps({**measure(epoch, epochs=spec["epochs"], bounds=spec["bounds"]), **info}))


if __name__ == "__main__":
    main()
