"""The flat dict of floats a training loop logs (`loader_metrics`): the exposed wait of the
current pass, the seconds each stage took in each process, what storage and the cache did,
and, on request, the slowest rank's wait at each step (one collective then, none otherwise).
Nothing of it is in ``state_dict``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from .clock import BATCHES, STAGES
from .waits import Waits

__all__ = ["LoaderMetrics", "RankWaits", "gather_ranks", "loader_metrics"]


@dataclasses.dataclass(frozen=True)
class RankWaits:
    """The steps already gathered across ranks (`loader_metrics(across_ranks=True)`) and the
    sums over them of the slowest and the mean rank's wait."""

    epoch: int = -1
    steps: int = 0
    slowest_s: float = 0.0
    mean_s: float = 0.0


class LoaderMetrics:
    """What a loader keeps for `TabularDataLoader.metrics`: the pass's waits, the stage clock
    as the pass began, and the steps gathered across ranks."""

    def __init__(self) -> None:
        self.waits: Waits | None = None
        self.since: np.ndarray | None = None
        self.ranks = RankWaits()

    def begin(self, epoch: int, started: float, dataset: Any) -> Waits:
        """A pass begins (``started``: when ``iter(loader)`` was called); its waits."""
        self.waits, self.since = Waits(epoch, started), dataset.clock.seconds()
        return self.waits

    def of(self, dataset: Any, *, num_workers: int, across_ranks: bool) -> dict[str, float]:
        """`loader_metrics` of the pass (``across_ranks``: gathered first)."""
        ranks = None
        if across_ranks:
            self.ranks = ranks = gather_ranks(self.waits or Waits(), self.ranks)
        return loader_metrics(self.waits, self.since, dataset, num_workers=num_workers, ranks=ranks)


def loader_metrics(
    waits: Waits | None,
    since: np.ndarray | None,
    dataset: Any,
    *,
    num_workers: int,
    ranks: RankWaits | None = None,
) -> dict[str, float]:
    """The metrics of the pass ``waits`` measures (``since``: the stage clock when it began).

    Keys: ``wait_s`` (the loop's total exposed wait in the pass), ``batches``, ``wait_mean_s``,
    ``wait_max_s``, ``wait_last_s``, ``elapsed_s`` (since the pass began), ``wait_share``
    (``wait_s / elapsed_s``), ``epoch``; ``<stage>_s`` for each of `STAGES` over all processes
    of the rank in the pass, ``worker<w>_<stage>_s`` and ``worker<w>_batches`` for each worker
    (``main_`` for the main process); ``planning_s``, ``storage_retries``, the cache's counts
    (``cache_hits``, ...); with ``ranks`` (a reduction): ``rank_wait_slowest_s`` and
    ``rank_wait_mean_s``, the sums over the pass's steps gathered so far of the slowest and
    the mean rank's wait at each step, and ``rank_steps``.
    """
    out: dict[str, float] = {}
    if waits is None:
        waits = Waits()
    elapsed = waits.elapsed()
    out.update(
        epoch=float(waits.epoch),
        batches=float(waits.batches),
        wait_s=waits.total,
        wait_mean_s=waits.total / waits.batches if waits.batches else 0.0,
        wait_max_s=waits.longest,
        wait_last_s=float(waits.each[-1]) if waits.batches else 0.0,
        elapsed_s=elapsed,
        wait_share=waits.total / elapsed if elapsed > 0 else 0.0,
    )
    seconds = dataset.clock.seconds()
    if since is not None:
        seconds = seconds - since
    for i, stage in enumerate(STAGES):
        out[f"{stage}_s"] = float(seconds[:, i].sum())
    names = [(0, "main")] + [(w + 1, f"worker{w}") for w in range(num_workers)]
    for slot, name in names:
        for i, stage in enumerate(STAGES[:2]):  # (what a producing process records)
            out[f"{name}_{stage}_s"] = float(seconds[slot, i])
        out[f"{name}_batches"] = float(seconds[slot, BATCHES])
    out["planning_s"] = float(getattr(dataset, "planning_s", 0.0))
    out["storage_retries"] = float(dataset.storage_retries)
    stats = dataset.cache_stats
    if stats is not None:
        for field in dataclasses.fields(stats):
            out[f"cache_{field.name}"] = float(getattr(stats, field.name))
    if ranks is not None:
        out.update(
            rank_wait_slowest_s=ranks.slowest_s,
            rank_wait_mean_s=ranks.mean_s,
            rank_steps=float(ranks.steps),
        )
    return out


def gather_ranks(waits: Waits, ranks: RankWaits) -> RankWaits:
    """``ranks`` with the steps of ``waits`` not gathered yet: every rank's wait at each, by
    one all-gather (every rank must call it at the same step).

    Raises:
        RuntimeError: torch.distributed is not initialized.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "metrics(across_ranks=True) gathers every rank's waits: initialize torch.distributed "
            "first (or call metrics() for this rank's)"
        )
    if ranks.epoch != waits.epoch:
        ranks = RankWaits(epoch=waits.epoch)
    mine = torch.tensor(np.asarray(waits.each[ranks.steps :], np.float64))
    if dist.get_backend() == "nccl":  # (NCCL gathers CUDA tensors only)
        mine = mine.cuda()
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    steps = torch.stack(gathered).cpu().numpy()  # (ranks, steps)
    return RankWaits(
        waits.epoch,
        ranks.steps + steps.shape[1],
        ranks.slowest_s + float(steps.max(axis=0).sum()),
        ranks.mean_s + float(steps.mean(axis=0).sum()),
    )
