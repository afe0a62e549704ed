"""The GPU fed: a training step with our loader against the same batches held in GPU memory.

Three measurements, each against its limit in the same run (issue 33):

1. Step time: an MLP (the tabular dataset's 8 floats and 64-float embedding in, each of
   ``--hidden`` wide) trained with batches from ``create_dataloader(device="cuda",
   pin_memory=True)`` and ``--workers`` workers, against the same number of steps over batches
   already in GPU memory. Goal: ours ≥ 0.95x the held batches' steps/s. Every id of the epoch
   is checked once. Each width also prints its step's split: the GPU's time a step (steps
   queued behind a sleeping kernel) and the CPU's to issue one. Where the CPU's is the longer
   (the default 4096 wide on an H200), the loop is bound by its main thread, and the loader's
   main-thread time a batch shows in full; where the GPU's is, the loader has a step to hide in.
2. Tokens/s of packed 4k sequences (``Packing("tokens", 4096)``) handed on the GPU, no model.
3. Host→device bandwidth: the bytes of the tabular batches handed on the GPU a second (no
   model), at ``--batch-size`` (copied on the step's stream) and at ``--big-batch`` rows
   (4.8 MB, at least `transport.device.SIDE_STREAM_BYTES`: copied on a side stream), each id
   once, against a pinned 256 MiB ``copy_`` (cudaMemcpy's peak on this machine).

Without a CUDA device it says so and measures nothing; ``--device cpu`` runs every path on the
CPU with small sizes, as a check that the script works (its numbers mean nothing).

Usage::

    python benchmarks/gpu.py                 # on a machine with a GPU
    python benchmarks/gpu.py --device cpu --rows 50000 --steps 20   # the script's own check
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_dataloader_utils as tdu
from throughput import DATA, make_tabular, make_tokens
from torch_dataloader_utils.transport.device import batch_nbytes

FEATURES = [f"f{j}" for j in range(8)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tabular_loader(data: Path, args: argparse.Namespace, device: torch.device) -> Any:
    return tdu.create_dataloader(
        str(data),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        pin_memory=device.type == "cuda",
        device=device,
        columns=["id", *FEATURES, "emb"],
    )


def inputs(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([torch.stack([batch[f] for f in FEATURES], 1), batch["emb"]], 1)


def model_step(hidden: int, device: torch.device) -> Callable[[dict[str, torch.Tensor]], Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(len(FEATURES) + 64, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, 1),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(batch: dict[str, torch.Tensor]) -> Any:
        loss = model(inputs(batch)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def timed_steps(
    batches: Iterable[dict[str, torch.Tensor]], step: Callable[..., Any], device: torch.device
) -> tuple[float, int, list[torch.Tensor]]:
    """Seconds for every step over ``batches``, the steps, and each batch's ids (on device)."""
    ids = []
    synchronize(device)
    start = time.perf_counter()
    for batch in batches:
        step(batch)
        ids.append(batch["id"])
    synchronize(device)
    return time.perf_counter() - start, len(ids), ids


def step_split(
    held: list[dict[str, torch.Tensor]], step: Callable[..., Any], device: torch.device
) -> tuple[float, float]:
    """Seconds a step takes the GPU and the CPU to issue, from 20 steps queued behind a
    sleeping kernel (the GPU runs them back to back; the CPU issues them without waiting)."""
    if device.type != "cuda":
        return float("nan"), float("nan")
    synchronize(device)
    torch.cuda._sleep(2_000_000_000)  # ~1 s: longer than issuing the steps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    issued = time.perf_counter()
    for batch in held[:20]:
        step(batch)
    issued = time.perf_counter() - issued
    end.record()
    synchronize(device)
    return start.elapsed_time(end) / 1e3 / 20, issued / 20


def step_time(
    data: Path, rows: int, hidden: int, args: argparse.Namespace, device: torch.device
) -> None:
    loader = tabular_loader(data, args, device)
    step = model_step(hidden, device)
    loader.set_epoch(0)
    held = [b for b in itertools.islice(loader, args.steps)]  # also warms the workers up
    for batch in held[:5]:
        step(batch)
    gpu_s, cpu_s = step_split(held, step, device)
    results = []
    for _ in range(args.repeat):
        held_s, n, _ = timed_steps(held, step, device)
        loader.set_epoch(loader.dataset.epoch + 1)
        ours_s, m, ids = timed_steps(loader, step, device)
        got = Counter(torch.cat(ids).tolist())
        assert got == Counter(range(rows)), "an epoch did not read every id once"
        results.append((n / held_s, m / ours_s))
    held_rate, ours_rate = max(r[0] for r in results), max(r[1] for r in results)
    bound = "GPU" if gpu_s >= cpu_s else "CPU (the main thread)"
    split = (
        f"A step takes the GPU {1e3 * gpu_s:.2f} ms, the CPU {1e3 * cpu_s:.2f} ms to issue: "
        f"bound by the {bound}"
        if device.type == "cuda"
        else "(no GPU: the step's split not measured)"
    )
    print(
        f"step time, MLP {hidden} wide, batch {args.batch_size}, {args.workers} workers: "
        f"held in GPU memory {1e3 / held_rate:.2f} ms a step, ours {1e3 / ours_rate:.2f} ms: "
        f"{ours_rate / held_rate:.2f}x (goal >= 0.95x); every id once. {split}"
    )


def bandwidth(data: Path, rows: int, args: argparse.Namespace, device: torch.device) -> None:
    host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=device.type == "cuda")
    target = torch.empty_like(host, device=device)
    peaks = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(host, non_blocking=True)
        synchronize(device)
        peaks.append(host.numel() / (time.perf_counter() - start))
    peak = max(peaks)
    print(f"host->device: a pinned 256 MiB copy {peak / 1e9:.1f} GB/s")
    for batch_size in (args.batch_size, args.big_batch):
        loader = tabular_loader(
            data, argparse.Namespace(**{**vars(args), "batch_size": batch_size}), device
        )
        rates = []
        for epoch in range(args.repeat):
            loader.set_epoch(epoch)
            nbytes, ids = 0, []
            synchronize(device)
            start = time.perf_counter()
            for batch in loader:
                nbytes += batch_nbytes(batch)
                ids.append(batch["id"])
            synchronize(device)
            rates.append(nbytes / (time.perf_counter() - start))
            assert Counter(torch.cat(ids).tolist()) == Counter(range(rows)), "an id lost"
        ours = max(rates)
        print(
            f"  batches of {batch_size:,} rows ({nbytes / len(ids) / 1e6:.2f} MB) handed on the "
            f"device: {ours / 1e9:.2f} GB/s ({ours / peak:.3f}x the copy's peak); every id once"
        )


def packed_tokens(data: Path, args: argparse.Namespace, device: torch.device) -> None:
    loader = tdu.create_dataloader(
        str(data),
        batch_size=args.sequences,
        packing=tdu.Packing("tokens", args.seq_len),
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        pin_memory=device.type == "cuda",
        device=device,
        columns=["tokens"],
    )
    rates = []
    for epoch in range(args.repeat + 1):  # the first starts the workers
        loader.set_epoch(epoch)
        tokens = 0
        synchronize(device)
        start = time.perf_counter()
        for batch in loader:
            tokens += batch["input_ids"].numel()
        synchronize(device)
        if epoch:
            rates.append(tokens / (time.perf_counter() - start))
    print(
        f"packed {args.seq_len}-token sequences, {args.sequences} a batch, on the device: "
        f"{max(rates):,.0f} tokens/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--token-rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--hidden", default="4096,8192", help="the MLP's widths, each a run")
    parser.add_argument("--big-batch", type=int, default=16_384, help="rows, for bandwidth")
    parser.add_argument("--steps", type=int, default=200, help="batches held in GPU memory")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--sequences", type=int, default=8, help="packed sequences a batch")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device, and this machine has none: nothing measured.")
        return
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        print(
            f"{torch.cuda.get_device_name(device)}, {os.cpu_count()} CPUs, "
            f"torch {torch.__version__}"
        )
    else:
        print(f"on {device}: a check that the script runs; the numbers mean nothing")
    tabular = make_tabular(DATA, args.rows)
    tokens = make_tokens(DATA, args.token_rows, lengths=(64, 4096))
    for hidden in map(int, args.hidden.split(",")):
        step_time(tabular, args.rows, hidden, args, device)
    bandwidth(tabular, args.rows, args, device)
    packed_tokens(tokens, args, device)


if __name__ == "__main__":
    main()
