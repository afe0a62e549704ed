"""One rank's passes over a dataset: the contract between the loader and the dataset
(`Readable`: what the loader uses of a dataset).

`Passes` answers, for the process it is used in: which epoch the next pass reads, which pass
this process (the main one, or a DataLoader worker) reads now and where it starts, how far the
pass being read has come, and the loader state of that position. `TabularDataLoader` talks to
the dataset through ``dataset.passes`` only (and the dataset's `FailureLog`); the dataset's
``__iter__`` asks it which pass to read.

The counters shared with DataLoader workers are a `PassControl` (the epoch rule of ADR 0009);
the state dict itself is written and read by `codec`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

import pyarrow as pa
from torch.utils.data import get_worker_info

from ..cache import CacheStats
from ..errors import InvalidArgumentError, TorchDataloaderUtilsWarning
from ..errors.on_error import FailureLog
from ..metrics.clock import StageClock
from ..planning import Layout, Leg, Pass, Plan, Ranks, Topology
from ..planning.streams import Streams
from .codec import (
    decode_layout,
    decode_state,
    decode_stream_state,
    encode_state,
    encode_stream_state,
    is_complete,
)
from .control import PassControl
from .keys import BATCHES, LAYOUT, LEGS, NUM_WORKERS, SKIPS, TOPOLOGY, WORLD_SIZE
from .progress import Progress, before_leg

__all__ = ["Passes", "Progress", "Readable"]

_T = TypeVar("_T")


class Passes:
    """The passes of one rank's copies of a dataset (see the module docstring).

    Args:
        plan: the plan (the state names its fingerprint and rows).
        streams: how the epochs are cut into streams (their layout orders and cuts them).
        ranks: how the calling process finds its rank.
    """

    def __init__(self, plan: Plan, streams: Streams, ranks: Ranks) -> None:
        self.plan = plan
        self.streams = streams
        self.ranks = ranks
        # Shared with this rank's DataLoader workers (persistent ones too).
        self.control = PassControl()
        self.pending: Pass | None = None  # a loaded state, for the next pass
        self.pending_complete = False  # ... whose epoch was complete
        self.progress: Progress | None = None  # the rank's pass a loader is reading
        self._begun: Pass | None = None  # the pass the main process began last
        self._claimed = True  # ... and whether this process's own __iter__ took it
        self._stream_resume: dict[str, Any] | None = None  # a worker's loaded stream state
        self.num_workers = 1  # the workers of the loader reading these passes (its len())
        # Batches not to deliver, by epoch: ranges of the rank's batch numbers (`skip`).
        self.skips: dict[int, list[tuple[int, int]]] = {}
        self.steps = (0, 0)  # a loaded state's `Pass.steps`
        # The legs of the epochs this process read after an elastic resume (`numbered`).
        self._legs: dict[int, tuple[Leg, ...]] = {}

    def new_pass(
        self, epoch: int, legs: tuple[Leg, ...] = (), batches: int = 0, generation: int = 0
    ) -> Pass:
        """A pass over ``epoch``, with the steps a weights schedule counts: a loaded state's,
        else this loader's own (world size and batch size)."""
        steps = self.steps
        if steps == (0, 0) and self.streams.scheduled:
            steps = (self.ranks.resolve()[1], self.layout.batch_size)
        return Pass(epoch, legs, batches, generation, steps)

    @property
    def layout(self) -> Layout:
        """The options that order and cut the streams."""
        return self.streams.layout

    # --- the epoch ------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch set with `set_epoch`, or of the pass begun last."""
        return self.control.epoch

    def set_epoch(self, epoch: int) -> None:
        """The next pass reads ``epoch``; a loaded state for another epoch is dropped."""
        self.control.set_epoch(epoch)
        pending = self.pending
        if pending is not None and pending.epoch != epoch:
            self.pending = None
            if pending.resumed and not self.pending_complete:
                warnings.warn(
                    f"set_epoch({epoch}) drops the loaded state, which was in the middle of "
                    f"epoch {pending.epoch}: the rest of that epoch will not be read. Call "
                    f"set_epoch({pending.epoch}) first to finish it",
                    TorchDataloaderUtilsWarning,
                    stacklevel=4,
                )

    # --- beginning a pass -----------------------------------------------------------------------

    def begin(self, num_workers: int) -> tuple[Progress, list[int], list[int]]:
        """Begin a pass for a loader's ``num_workers`` DataLoader workers (main process).

        Returns the pass's progress (kept as `progress`), the batches of each worker's stream
        and how many each already delivered (a resume). Workers receive the pass with the
        dataset and apply it to this pass only.
        """
        pass_ = self._begin(for_workers=True)
        rank, world_size = self.ranks.resolve()
        topology = Topology(rank, world_size, 0, max(1, num_workers))
        counts, done = self.streams.rank_streams(pass_, topology)
        progress = Progress(pass_, pass_.batches, sum(counts), Topology(rank, world_size))
        self.progress = progress
        return progress, counts, done

    def _begin(self, *, for_workers: bool) -> Pass:
        epoch, generation = self.control.begin(for_workers=for_workers)
        pending, self.pending = self.pending, None
        if pending is not None and pending.epoch == epoch:
            pass_ = dataclasses.replace(pending, generation=generation)
            if self.pending_complete:
                self.control.delivered()  # a complete epoch: the pass after it reads the next
        else:
            pass_ = self.new_pass(epoch, generation=generation)
        self._begun, self._claimed = pass_, not for_workers
        self._legs.pop(epoch, None)
        if pass_.legs:
            self._legs[epoch] = pass_.legs
        return pass_

    def this_pass(self, topology: Topology) -> tuple[Pass, int | None]:
        """The pass this process reads, and the batches its stream already delivered (None:
        as the pass's rank-level position says)."""
        if get_worker_info() is None:
            if self._begun is not None and not self._claimed:
                self._claimed = True  # begun by a TabularDataLoader for this pass
                return self._begun, None
            return self._begin(for_workers=False), None
        loaded, self._stream_resume = self._stream_resume, None
        if loaded is not None:  # a StatefulDataLoader gave this worker its saved state
            pass_, done = decode_stream_state(
                loaded,
                self.plan,
                world_size=topology.world_size,
                num_workers=topology.num_workers,
                worker=topology.worker,
                layout=self.layout,
            )
            self.control.begin_worker(topology.worker, pass_.epoch)
            return pass_, done
        epoch = self.control.begin_worker(topology.worker)
        generation = self.control.generation
        if epoch is not None:  # a pass no main process began (a plain DataLoader's)
            return self.new_pass(epoch, generation=generation), None
        mine = self._begun  # this copy of the pass the main process began, if it is this one
        if mine is not None and mine.generation == generation:
            return mine, None
        return self.new_pass(self.epoch, generation=generation), None

    # --- the batches of an epoch, numbered ------------------------------------------------------

    def numbered(self, epoch: int) -> Pass:
        """The pass over ``epoch`` whose batches `rows_at` and `skip` number, from the epoch's
        first on this rank: the pass loaded or begun last, if of ``epoch``, with the legs of
        its elastic resumes (an earlier leg's batches come first); else the last pass read of
        it here; else a fresh pass."""
        for pass_ in (self.pending, self._begun):
            if pass_ is not None and pass_.epoch == epoch:
                return dataclasses.replace(pass_, batches=0, generation=0)
        return self.new_pass(epoch, self._legs.get(epoch, ()))

    def rank_batches(self, epoch: int, *, num_workers: int = 1) -> int:
        """Batches this rank yields in ``epoch`` (skipped ones counted), as `numbered` numbers
        them: a fresh pass's, or a resumed one's earlier legs' and its own.

        Raises:
            TypeError: the count depends on the number of workers
                (``split_strategy="round_robin"``).
        """
        rank, world_size = self.ranks.resolve()
        topology = Topology(rank, world_size, 0, max(1, num_workers))
        pass_ = self.numbered(epoch)
        if not pass_.legs:
            return self.streams.rank_batches(topology, epoch)
        return before_leg(pass_) + sum(self.streams.rank_streams(pass_, topology)[0])

    def delivered_in(self, epoch: int) -> int:
        """Batches of ``epoch`` (numbered as `numbered` numbers them) delivered in the pass
        being read, or before the state loaded for it: 0 when neither is of ``epoch`` or it is
        complete (a pass after it reads the epoch anew)."""
        if self.pending is not None:
            pass_, complete = self.pending, self.pending_complete
        elif self.progress is not None:
            progress = self.progress
            pass_ = dataclasses.replace(progress.pass_, batches=progress.batches)
            complete = progress.complete
        else:
            return 0
        if pass_.epoch != epoch or complete:
            return 0
        return before_leg(pass_) + pass_.batches

    # --- skipped batches ---------------------------------------------------------------------

    def skip(self, epoch: int, first: int, stop: int, *, num_workers: int = 1) -> None:
        """Do not deliver batches ``[first, stop)`` of ``epoch`` (numbered as `numbered`
        numbers them), on any rank.

        Raises:
            InvalidArgumentError: the range is empty, passes the epoch's end, or holds batches
                delivered already.
        """
        batches = self.rank_batches(epoch, num_workers=num_workers)
        if not 0 <= first < stop <= batches:
            raise InvalidArgumentError(
                f"skip batches [{first}, {stop}) of epoch {epoch}: the epoch has {batches} "
                f"batches (0 to {batches - 1}), and the range must be inside it and not empty"
            )
        delivered = self.delivered_in(epoch)
        if first < delivered:
            # (They would count out of len() and the state, yet have been delivered.)
            raise InvalidArgumentError(
                f"skip batches [{first}, {stop}) of epoch {epoch}: batches 0 to "
                f"{delivered - 1} of it were delivered already (this pass, or the loader whose "
                f"state was loaded, is at batch {delivered}); skip batches from {delivered} on"
            )
        ranges = sorted([*self.skips.get(epoch, []), (first, stop)])
        merged: list[tuple[int, int]] = []
        for a, b in ranges:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        self.skips[epoch] = merged

    def skipped(self, epoch: int, batch: int) -> bool:
        """Whether batch ``batch`` of ``epoch`` is one not to deliver."""
        return any(a <= batch < b for a, b in self.skips.get(epoch, ()))

    def skipped_in(self, epoch: int) -> int:
        """Batches of ``epoch`` not to deliver."""
        return sum(b - a for a, b in self.skips.get(epoch, ()))

    def skipping(self, batches: Iterator[_T], progress: Progress) -> Iterator[_T]:
        """``batches`` less those not to deliver, each of which counts as delivered (the state
        goes past it). Skips given while the pass is read apply to the batches still to come."""
        epoch = progress.pass_.epoch
        # Counted here, not from `progress`: a reader one batch ahead (a device copy,
        # accelerate's last-batch look-ahead) takes the next before this one is counted.
        at = before_leg(progress.pass_) + progress.start
        for batch in batches:
            at += 1
            if self.skipped(epoch, at - 1):
                progress.delivered += 1
                if progress.delivered == 1:
                    self.control.delivered()
                continue
            yield batch

    def counted(self, batches: Iterator[_T], progress: Progress) -> Iterator[_T]:
        """``batches``, counted as delivered in ``progress``; the first makes the next pass
        read the next epoch unless `set_epoch` says otherwise."""
        for batch in batches:
            progress.delivered += 1
            if progress.delivered == 1:
                self.control.delivered()
            yield batch

    # --- the state ------------------------------------------------------------------------------

    def state_at(self, pass_: Pass, *, num_workers: int, complete: bool) -> dict[str, Any]:
        """The loader state of ``pass_`` (see `TabularDataLoader.state_dict`)."""
        state = encode_state(
            self.plan,
            pass_,
            world_size=self.ranks.resolve()[1],
            num_workers=max(1, num_workers),
            layout=self.layout,
            complete=complete,
        )
        if self.skips:
            state[SKIPS] = {str(e): [list(r) for r in rs] for e, rs in self.skips.items()}
        return state

    def position(self, progress: Progress | None, *, num_workers: int) -> dict[str, Any]:
        """The loader state where ``progress`` stands (a loaded state not yet read: itself)."""
        if self.pending is not None:
            return self.state_at(
                self.pending, num_workers=num_workers, complete=self.pending_complete
            )
        if progress is None or progress.pass_.epoch != self.epoch:
            return self.state_at(self.new_pass(self.epoch), num_workers=num_workers, complete=False)
        now = dataclasses.replace(progress.pass_, batches=progress.batches, generation=0)
        return self.state_at(now, num_workers=num_workers, complete=progress.complete)

    def load_state(
        self, state: dict[str, Any], *, num_workers: int, allow_changed_data: bool = False
    ) -> Pass:
        """Make the next pass resume ``state``; returns that pass (see `decode_state`)."""
        pass_ = decode_state(
            state,
            self.plan,
            world_size=self.ranks.resolve()[1],
            num_workers=max(1, num_workers),
            layout=self.layout,
            allow_changed_data=allow_changed_data,
        )
        self.skips = _skips(state)
        self.steps = pass_.steps
        pass_ = self._carry_skips(state, pass_, num_workers=num_workers)
        self.pending = pass_
        self.pending_complete = is_complete(state)
        self.progress = None
        # A complete epoch: the next pass reads the next epoch (as a StatefulDataLoader's
        # finished state does, which Lightning relies on), unless set_epoch(its epoch) asks
        # for the (empty) rest of it.
        self.control.set_epoch(pass_.epoch, advance=self.pending_complete)
        return pass_

    def _carry_skips(self, state: dict[str, Any], pass_: Pass, *, num_workers: int) -> Pass:
        """``pass_`` with the saved epoch's skips not yet reached carried as rows when it
        resumes on another topology: they are numbered for the saved one, so they go with its
        leg (`planning.resume.remaining` leaves their rows out)."""
        epoch = pass_.epoch
        topology = state[TOPOLOGY]
        saved = Leg(
            topology[WORLD_SIZE],
            topology[NUM_WORKERS],
            decode_layout(state[LAYOUT], "layout"),
            int(state[BATCHES]),
        )
        now = (self.ranks.resolve()[1], max(1, num_workers), self.layout)
        # Skips number the epoch's batches, a leg's skips its own (`Leg.skips`).
        before = sum(int(leg[BATCHES]) for leg in state[LEGS])
        at = before + saved.batches
        future = [(max(a, at) - before, b - before) for a, b in self.skips.get(epoch, ()) if b > at]
        if not future or (saved.world_size, saved.num_workers, saved.layout) == now:
            return pass_
        if not self.streams.skips_carried:
            raise InvalidArgumentError(
                f"the state skips batches of epoch {epoch} it had not reached, numbered for the "
                "topology it was saved on: packed sequences and token budgets resume them only "
                "on that topology"
            )
        legs = pass_.legs
        if saved.batches:  # (the saved topology is the last leg)
            legs = (*legs[:-1], dataclasses.replace(legs[-1], skips=tuple(future)))
        else:
            legs = (*legs, dataclasses.replace(saved, skips=tuple(future)))
        self.skips[epoch] = []  # (rows now, left out of what the new topology reads)
        return self.new_pass(epoch, legs)

    def stream_state(self, progress: Progress | None, topology: Topology) -> dict[str, Any]:
        """The state of a DataLoader worker's stream (``progress``: its pass, if begun)."""
        started = progress is not None
        if progress is None:  # asked before this worker began a pass: the next one, unread
            progress = Progress(self.new_pass(self.epoch), 0, 0, topology)
        return encode_stream_state(
            self.plan,
            progress.pass_,
            world_size=topology.world_size,
            num_workers=topology.num_workers,
            worker=topology.worker,
            batches=progress.batches,
            layout=self.layout,
            complete=started and progress.complete,
        )

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Resume this worker's stream from ``state`` (checked when its pass begins)."""
        self._stream_resume = state


class Readable(Protocol):
    """What a `TabularDataLoader` uses of its dataset (an iterable of batches besides)."""

    @property
    def passes(self) -> Passes:
        """The rank's passes (epoch, position, state)."""

    @property
    def failure_log(self) -> FailureLog:
        """The reads this process skipped and has not reported yet."""

    @property
    def finish(self) -> Any:
        """The main process's last conversion step of a worker's batch, or ``None``."""

    @property
    def cache_stats(self) -> CacheStats | None:
        """What the node-local cache did so far; None without a cache."""

    @property
    def clock(self) -> StageClock:
        """The seconds each process spent in each stage (`metrics.clock`)."""

    @property
    def storage_retries(self) -> int:
        """Storage requests retried so far, in every process."""

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next pass."""

    def rows_at(
        self,
        batch: int,
        epoch: int | None = None,
        rank: int | None = None,
        *,
        num_workers: int = 1,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The rows of a batch, from the plan (see `TabularDataLoader.rows_at`)."""

    def __iter__(self) -> Iterator[Any]:
        """The batches of this process's stream of the next pass."""


def _skips(state: dict[str, Any]) -> dict[int, list[tuple[int, int]]]:
    """The skipped batches a loader state carries (`Passes.skip`)."""
    saved = state.get(SKIPS) or {}
    return {int(e): [(int(a), int(b)) for a, b in ranges] for e, ranges in saved.items()}
