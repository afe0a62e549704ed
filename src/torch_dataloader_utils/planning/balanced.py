"""Streams whose batches are handed out by cost across ranks (`Balanced`; issue 45,
docs/adr/0032-balance-by-compute.md).

Step ``s`` of every rank is served by the same DataLoader worker ``w`` (round robin), so the
batches of worker ``w``'s streams of all ``R`` ranks are what a step can trade. Every process
computes every one of those streams' batch costs from the plan and a length index (the
``costs`` it is given), cuts them into windows of ``ceil(window / num_workers)`` batches and
regroups each window's ``R x W`` batches by cost (`balance.balance_epoch`). A stream then
delivers, in turn, the batches its slots were given: each is read from the stream that
planned it (`stream.balanced`), so every batch is still read and delivered exactly once.

A pass resumes at its window's first batch: the sources restart there and the batches the
stream delivered before are passed over. An earlier leg (an elastic resume) must have stopped
at a window's end, where every source had delivered a prefix of its batches, the only rest
the streams below can carry; elsewhere the resume is refused. Costs that cannot be predicted
(the rest of a packed block an elastic resume left: its order depends on its data) leave that
pass in plan order.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, StateMismatchError
from .balance import BalancedPass, balance_epoch
from .budget import Lengths
from .layout import Layout
from .resume import Pass
from .streams import Stream, Streams
from .topology import Topology

__all__ = ["Balanced", "worker_window"]

logger = logging.getLogger("torch_dataloader_utils.dataset")

# What a batch costs, each batch of a stream's pass from its first (a function of the plan).
Costs = Callable[[Stream], np.ndarray]


def worker_window(window: int, num_workers: int) -> int:
    """Batches of one worker's stream in a window of ``window`` steps."""
    return max(1, -(-window // max(1, num_workers)))


@dataclass(frozen=True, eq=False)
class Balanced:
    """The streams of ``streams`` with every window's batches regrouped by cost across ranks.

    Attributes:
        streams: the streams the batches are planned and read by.
        window: steps a window (`batching.Balance.window`).
        costs: each batch's cost in a stream's pass (the same in every process).
    """

    streams: Streams
    window: int
    costs: Costs
    # The last passes' picks (a pass asks for them in its main process and each worker).
    _picks: dict[tuple[Any, ...], np.ndarray | None] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def layout(self) -> Layout:
        return self.streams.layout

    @property
    def epoch_rows(self) -> int:
        return self.streams.epoch_rows

    @property
    def scheduled(self) -> bool:
        return self.streams.scheduled

    @property
    def lengths(self) -> Lengths | None:
        return self.streams.lengths

    @property
    def skips_carried(self) -> bool:
        return False

    def with_layout(self, layout: Layout) -> Balanced:
        if layout == self.layout:
            return self
        return dataclasses.replace(self, streams=self.streams.with_layout(layout), _picks={})

    def budgeted(self, lengths: Lengths, column: str, truncate: bool) -> Streams:
        raise InvalidArgumentError("balance a token budget's streams, not the other way round")

    def rank_streams(self, pass_: Pass, rank: Topology) -> tuple[list[int], list[int]]:
        self._check_legs(pass_)
        return self.streams.rank_streams(pass_, rank)

    def rank_batches(self, rank: Topology, epoch: int = 0) -> int:
        return self.streams.rank_batches(rank, epoch)

    def resolve(self, pass_: Pass, topology: Topology, *, done: int | None = None) -> Stream:
        own = self.streams.resolve(pass_, topology, done=done)
        picks = self._worker_picks(pass_, topology)
        if picks is None:  # (costs not predictable: the pass in plan order)
            return own
        width = worker_window(self.window, topology.num_workers)
        first = own.done // width * width
        sources = tuple(
            self.streams.resolve(pass_, self._at(topology, rank), done=first)
            for rank in range(topology.world_size)
        )
        mine = picks[own.done : own.batches, topology.rank]
        balanced = BalancedPass(
            sources, first, np.stack([mine % topology.world_size, mine // topology.world_size], 1)
        )
        return dataclasses.replace(own, balanced=balanced)

    @staticmethod
    def _at(topology: Topology, rank: int) -> Topology:
        return Topology(rank, topology.world_size, topology.worker, topology.num_workers)

    def _worker_picks(self, pass_: Pass, topology: Topology) -> np.ndarray | None:
        """Slot ``(batch, rank)`` of worker ``topology.worker``'s streams of ``pass_``: the
        batch it takes, as ``batch * world_size + rank`` of the plan's (None: in plan order)."""
        key = (pass_.epoch, pass_.legs, topology.world_size, topology.num_workers, topology.worker)
        if key in self._picks:
            return self._picks[key]
        if len(self._picks) > 8:
            self._picks.clear()
        costs = []
        try:
            for rank in range(topology.world_size):
                stream = self.streams.resolve(pass_, self._at(topology, rank), done=0)
                costs.append(np.asarray(self.costs(stream), dtype=np.float64))
        except InvalidArgumentError as exc:
            logger.warning("balance: epoch %d's pass is read in plan order (%s)", pass_.epoch, exc)
            self._picks[key] = None
            return None
        steps = min(len(c) for c in costs)  # (uneven remainders: the common steps trade)
        matrix = np.stack([c[:steps] for c in costs], axis=1)
        picks = np.empty((max(len(c) for c in costs), topology.world_size), np.int64)
        picks[steps:] = np.arange(steps, len(picks))[:, None] * topology.world_size + np.arange(
            topology.world_size
        )
        if steps:
            picks[:steps] = balance_epoch(
                matrix,
                window=worker_window(self.window, topology.num_workers),
                seed=self.layout.seed,
                epoch=pass_.epoch,
                leg=len(pass_.legs),
                worker=topology.worker,
            )
        self._picks[key] = picks
        return picks

    def _check_legs(self, pass_: Pass) -> None:
        """Refuse a pass whose earlier leg stopped inside a window (see the module).

        Raises:
            StateMismatchError: it did.
        """
        for depth, leg in enumerate(pass_.legs):
            steps = worker_window(self.window, leg.num_workers) * leg.num_workers
            if leg.batches % steps == 0:
                continue
            total = self.with_layout(leg.layout).streams.rank_batches(
                Topology(0, leg.world_size, 0, leg.num_workers), pass_.epoch
            )
            if depth == 0 and leg.batches >= total:  # (the epoch read whole)
                continue
            raise StateMismatchError(
                f"the state was saved by {leg.world_size} ranks x {leg.num_workers} workers "
                f"after {leg.batches} balanced batches of epoch {pass_.epoch}, inside a window of "
                f"{steps} steps: it resumes on another topology only from a window's end (a "
                f"multiple of {steps} batches) or the next epoch; resume it on the topology it "
                "was saved on"
            )
