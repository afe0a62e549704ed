"""The DataLoader of a dataset (`TabularDataLoader`). Its options are checked as a value before
it is built (`options.LoaderOptions`); `create_dataloader` (create.py) builds the dataset
first."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, cast

import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import _InfiniteConstantSampler

from .cache import CacheStats
from .errors import InvalidArgumentError, TorchDataloaderUtilsError, WorkerDiedError
from .errors.keywords import refuse_rebatching
from .errors.on_error import FailureLog, ReadFailure
from .metrics.clock import DEVICE, MAKE, QUEUE, READ, UNPACK
from .metrics.report import LoaderMetrics
from .state import Readable, read_failures, with_read_failures
from .state.wrappers import Forwarded, Reader, gradient_state, kept, tracked
from .transport import Unbundler, forget_exited_workers, in_order, init_worker, to_device
from .transport.deaths import DEATH_GRACE_S, deaths, died_error, release, shut_down, watching
from .transport.worker import starting_workers

__all__ = [
    "DEFAULT_BUNDLE_ROWS",
    "EpochSampler",
    "TabularDataLoader",
]

# Rows a worker sends per message: one message per batch caps the workers' throughput
# (docs/adr/0003-bundled-packed-transport.md; benchmarks/throughput.py).
DEFAULT_BUNDLE_ROWS = 32_768

_T = TypeVar("_T")
_D = TypeVar("_D", bound=Readable)


def _identity(batch: Any) -> Any:
    return batch


class EpochSampler(_InfiniteConstantSampler):
    """The ``sampler`` of a `TabularDataLoader`: what trainers call ``set_epoch`` on.

    Lightning (and other trainers that own the epoch loop) hand the epoch to
    ``loader.sampler.set_epoch``; this forwards it to the dataset. As the sampler of an
    iterable-style DataLoader it yields ``None`` forever, like torch's own.
    """

    def __init__(self, dataset: Readable) -> None:
        super().__init__()
        self.dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        """Set the dataset's epoch (see `StructuredDataset.set_epoch`)."""
        self.dataset.set_epoch(epoch)


class TabularDataLoader(DataLoader[Any], Generic[_D]):
    """A ``torch.utils.data.DataLoader`` over a `StructuredDataset`.

    It is an ordinary DataLoader (``batch_size=None``: the dataset yields whole batches) with
    three additions: `set_epoch`; `state_dict` / `load_state_dict` (the torchdata
    ``StatefulDataLoader`` protocol: exact and elastic resume); and a cheaper worker→main
    transport (several batches per message, packed into one shared buffer). The user still
    receives one batch per iteration, in DataLoader's own order (one batch from each worker in
    turn), whatever the bundling.

    Args:
        dataset: the dataset.
        num_workers: DataLoader worker processes (0: read in the main process).
        bundle_rows: rows per worker message (0: one batch per message).
        **kwargs: passed to ``DataLoader`` (``pin_memory``, ``prefetch_factor``,
            ``persistent_workers``, ``multiprocessing_context``, ``timeout``, ...).
    """

    dataset: _D  # type: ignore[assignment]  # (torch's is a Dataset; ours reads passes too)
    # accelerate's prepare() returns a loader with this attribute unchanged. Ours already reads
    # only its rank's share with equal batch counts; rebuilt by prepare(), every rank would
    # read the whole data (dispatch_batches=False) or rank 0 would read its share and split it
    # among all ranks (the default): rows lost or read N times (docs/how-to/distributed.md).
    _is_accelerate_prepared = True
    # accelerate's save_state()/load_state() then save and load this loader's state.
    use_stateful_dataloader = True

    def __init__(
        self,
        dataset: _D,
        *,
        num_workers: int = 0,
        bundle_rows: int = DEFAULT_BUNDLE_ROWS,
        worker_init_fn: Callable[[int], None] | None = None,
        device: torch.device | str | None = None,
        accelerator: Any = None,
        batch_size: int | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        collate_fn: Callable[[Any], Any] | None = None,
        shuffle: bool | None = None,
        drop_last: bool = False,
        **kwargs: Any,
    ) -> None:
        # Frameworks rebuild a DataLoader from its attributes (Lightning for predict, with
        # batch_size=None, sampler=None, batch_sampler=None, collate_fn=...): what they pass
        # back is accepted; anything that would change the batches is refused.
        refuse_rebatching(
            batch_size=batch_size,
            sampler=None if isinstance(sampler, EpochSampler) else sampler,
            batch_sampler=batch_sampler,
            collate_fn=None if collate_fn is _identity else collate_fn,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        self._bundle_rows = bundle_rows
        if device is None and accelerator is not None:
            device = accelerator.device
        self.device = torch.device(device) if device is not None else None
        self._gradient_state = gradient_state() if accelerator is not None else None
        # Read by accelerate's GradientState while this loader is iterated (gradient
        # accumulation syncs on the last batch; gather_for_metrics reads the remainder).
        self.end_of_dataloader = False
        self.remainder = -1
        # What the node-local cache did in each epoch this loader read (passes of one epoch
        # add up).
        self._cache_epochs: dict[int, CacheStats] = {}
        # Reads skipped under on_error="skip" (this process's and its workers'), and the counts
        # a loaded state carried.
        self._read_failures: list[ReadFailure] = []
        self._failures_before = (0, 0)
        # A wrapper reading ahead of the user (Ray Train's default): its batch is not delivered.
        self._reader: Reader | None = None
        self._metrics = LoaderMetrics()  # the pass's exposed waits (`metrics`)
        super().__init__(
            cast("Dataset[Any]", dataset),
            batch_size=None,
            collate_fn=_identity,
            num_workers=num_workers,
            worker_init_fn=worker_init_fn,
            **kwargs,
        )
        # Trainers that own the epoch loop call loader.sampler.set_epoch (Lightning does);
        # DataLoader refuses sampler= for iterable datasets and its assignment after __init__.
        object.__setattr__(self, "sampler", EpochSampler(dataset))
        # (Token-budget batches count per worker: the dataset's len() counts with these.)
        dataset.passes.num_workers = max(1, num_workers)
        # Wrappers that copy a loader's attributes (Ray Train's prepare_data_loader) keep these
        # working through the wrapper: `wrapped.state_dict()` is this loader's.
        self.__dict__.update(Forwarded.methods(self, "set_epoch", "state_dict", "load_state_dict"))

    def __len__(self) -> int:
        """Batches this rank yields in the loader's epoch (less those `skip` leaves out)."""
        # (The dataset's own length counts them: they are read, then dropped here, and
        # DataLoader warns when more come than that length says.)
        passes = self.dataset.passes
        return super().__len__() - passes.skipped_in(passes.epoch)

    def metrics(self, *, across_ranks: bool = False) -> dict[str, float]:
        """Where this rank's time went in the current pass (or the last one), a flat dict of
        floats for ``log_dict``: ``wait_s``, the loop's exposed wait over the pass's
        ``batches``, and the seconds each stage took (`metrics.report.loader_metrics` lists
        the keys). Nothing is exchanged and nothing of it is in `state_dict`;
        ``across_ranks=True`` (one all-gather: call it on every rank at the same step) adds
        the slowest and the mean rank's wait summed over the steps.

        Raises:
            RuntimeError: ``across_ranks=True`` without torch.distributed initialized.
        """
        return self._metrics.of(
            self.dataset, num_workers=self.num_workers, across_ranks=across_ranks
        )

    def skip(self, epoch: int, batches: range) -> None:
        """Do not deliver ``batches`` (numbered from the first batch of ``epoch``, as `rows_at`
        numbers them) on any rank: every rank still yields as many batches, each the same ones
        it would have, less these. The skip is part of `state_dict`, so a loader resumed from it
        skips them too. A skip given while the epoch is read applies to the batches still to come.

        Raises:
            InvalidArgumentError: the range is empty, steps, passes the end of the epoch, or
                holds batches already delivered (in this pass, or before the state loaded).
        """
        if not isinstance(batches, range) or batches.step != 1:
            raise InvalidArgumentError(f"skip takes a range of batches, got {batches!r}")
        self.dataset.passes.skip(epoch, batches.start, batches.stop, num_workers=self.num_workers)

    def rows_at(
        self,
        batch: int,
        epoch: int | None = None,
        rank: int | None = None,
        *,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The rows this loader delivers as batch ``batch`` of ``epoch`` (default: the loader's
        epoch) on ``rank`` (default: this one), in delivered order, computed from the plan
        without iterating (docs/concepts/order.md).

        The table holds the data's ``columns`` (default: the dataset's; a packed dataset's:
        none), ``__file__`` (each row's file), ``__row__`` (its row in the file, counting rows
        a filter leaves out; null where the plan cannot tell) and, for a mixture,
        ``__source__``. A packed batch's rows are the fragments of documents it holds, in
        token order: ``__fragment_tokens__`` (its document's tokens it holds) and
        ``__fragment_start__`` (where in its document it starts), then ``columns`` of its
        document and the document's file and row.

        Batches are numbered as `skip` and ``len()`` number them: from the epoch's first batch
        on this rank, skipped ones counted. Resumed from a state, the numbers go on from the
        state's: batch ``k`` is the epoch's ``k``-th on this rank, whichever loader delivered it.
        After an elastic resume (other ranks, workers or options) inside ``epoch``, the
        batches before it are those the saved loader's ``rank`` delivered, the later ones this
        loader's. This holds for the pass loaded or being read, and the last one read of
        ``epoch``; otherwise the batch is a fresh pass's, on this loader's topology.

        Raises:
            InvalidArgumentError: no such batch or rank (or no such rank before an elastic
                resume).
            ColumnNotFoundError: a column asked for is not in the data.

        Example:
            >>> loader.rows_at(123, epoch=3, columns=["id"]).to_pylist()  # doctest: +SKIP
            [{'id': 90211, '__file__': 's3://corpus/part-0412.parquet', '__row__': 211}, ...]
        """
        return self.dataset.rows_at(
            batch, epoch, rank, num_workers=self.num_workers, columns=columns
        )

    @kept
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the dataset (reaches persistent workers)."""
        self.dataset.set_epoch(epoch)

    @property
    def read_failures(self) -> list[ReadFailure]:
        """The reads skipped under ``on_error="skip"``, oldest first, each with its file, rows,
        the rows replaced and the error (a worker's arrive with its next batches)."""
        return list(self._read_failures)

    @property
    def cache_stats(self) -> CacheStats | None:
        """What the node-local cache (``cache_dir``) did so far: hits, misses, bytes from the
        cache and from the store, requests, evictions; planning included; every worker
        counted. None without a cache."""
        stats: CacheStats | None = self.dataset.cache_stats
        return stats

    @property
    def cache_epochs(self) -> dict[int, CacheStats]:
        """`cache_stats` per epoch this loader read (what each epoch's passes added)."""
        return dict(self._cache_epochs)

    def _cache_counted(self, batches: Iterator[Any], epoch: int) -> Iterator[Any]:
        before = self.cache_stats
        try:
            yield from batches
        finally:
            after = self.cache_stats
            if before is not None and after is not None:
                earlier = self._cache_epochs.get(epoch, CacheStats())
                self._cache_epochs[epoch] = earlier + (after - before)

    # --- state ----------------------------------------------------------------------------------

    @kept
    def state_dict(self) -> dict[str, Any]:
        """Where this rank stands: the epoch and the batches it delivered, small and versioned.

        Taken after ``k`` batches and loaded into a freshly built loader, the loader continues
        with exactly the batches this one would have produced next. A state taken on rank 0
        resumes every rank, also with another number of ranks or workers (elastic). Plain
        Python values: save it with ``torch.save`` or JSON. See docs/concepts/checkpointing.md.

        Under ``on_error="skip"`` it also counts the reads this rank skipped
        (``"read_failures"``: ``failures`` and ``rows``, over every pass since the state the
        loader was built or loaded with).
        """
        failures, rows = self._failures_before
        progress = self.dataset.passes.progress
        held = self._reader.held() if self._reader is not None else 0
        if held and progress is not None:  # produced for a look-ahead reader, not delivered
            progress = dataclasses.replace(progress, delivered=progress.delivered - held)
        position = self.dataset.passes.position(progress, num_workers=self.num_workers)
        return with_read_failures(
            position,
            failures + len(self._read_failures),
            rows + sum(f.skipped for f in self._read_failures),
        )

    @kept
    def load_state_dict(
        self, state_dict: dict[str, Any], *, allow_changed_data: bool = False
    ) -> None:
        """Resume from ``state_dict`` on the next iteration (and set the epoch to its epoch).

        Args:
            state_dict: what `state_dict` returned, on any rank, with any number of ranks or
                workers.
            allow_changed_data: resume at the same epoch and batch even if the data no longer
                plans the same (rows may then be lost or repeated).

        Raises:
            StateMismatchError: the state is not a loader state of this version, or comes from
                other data (it says what changed), or cannot resume elastically.
        """
        counted = read_failures(state_dict)
        self.dataset.passes.load_state(
            state_dict, num_workers=self.num_workers, allow_changed_data=allow_changed_data
        )
        self._failures_before = counted
        self._read_failures.clear()

    def _stop_persistent_workers(self) -> None:
        # Persistent workers hold the dataset as it was when they started; the next pass
        # starts new ones that carry the loaded state.
        iterator = getattr(self, "_iterator", None)
        if iterator is not None:
            shut_down(iterator)
            self._iterator = None

    # --- dead workers (see transport/deaths.py) ------------------------------------------

    def _waiting(self, iterator: Any, wait: Callable[[], _T]) -> _T:
        """``wait()`` on ``iterator``'s workers; a worker's death becomes one `WorkerDiedError`,
        after which the iterator is shut down and forgotten (the next pass starts new workers).
        """
        try:
            with watching(iterator):
                lost = deaths(iterator)  # died while the user held the last batch
                if lost:
                    raise died_error(lost)
                return wait()
        except WorkerDiedError:
            self._forget(iterator)
            raise
        except TorchDataloaderUtilsError:
            raise  # a worker's own error, re-raised by torch
        except (RuntimeError, OSError, EOFError) as exc:
            # torch's forms of a death (see transport/deaths.py), judged by exit status, not by
            # message. One can precede the exit by a moment (a ConnectionResetError from the
            # dying worker's socket; the pin-memory thread it stopped): any other error of
            # these types waits DEATH_GRACE_S before it goes on unchanged.
            lost = deaths(iterator, wait=DEATH_GRACE_S)
            if not lost:
                raise
            self._forget(iterator)
            raise died_error(lost) from exc

    def _forget(self, iterator: Any) -> None:
        shut_down(iterator)
        if self._iterator is iterator:
            self._iterator = None

    def _watched(self, iterator: Any) -> Iterator[Any]:
        """The messages of ``iterator`` (torch's), a dead worker reported as one error."""
        while True:
            message = self._waiting(iterator, functools.partial(next, iterator, _END))
            if message is _END:
                return
            yield message

    # --- iteration ------------------------------------------------------------------------------

    def _get_iterator(self) -> Any:
        # Bundling is switched on in the workers of THIS loader's iterators only: the public
        # worker_init_fn stays the user's, so a DataLoader rebuilt from this one's attributes
        # (as accelerate's prepare() does) gets plain batches, never bundles it cannot unpack.
        if self.num_workers == 0:
            return super()._get_iterator()
        user_init = self.worker_init_fn
        rows = max(1, self._bundle_rows)  # 1 row: one batch per message
        self.worker_init_fn = functools.partial(init_worker, rows, user_init)
        starting_workers()
        try:
            iterator = super()._get_iterator()
        finally:
            self.worker_init_fn = user_init
        release(iterator)  # in torch's SIGCHLD registry only while waited on (`_waiting`)
        return iterator

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        started = time.perf_counter()  # (the loop waits from here: `metrics`)
        dataset = self.dataset
        if self._iterator is not None:  # persistent workers: one may have died since
            self._waiting(self._iterator, lambda: None)
        passes = dataset.passes
        progress, counts, done = passes.begin(self.num_workers)
        if progress.pass_.resumed:
            self._stop_persistent_workers()  # they hold the dataset as it was when they started
        batches: Iterator[Any]
        if self._iterator is not None:  # resets the persistent workers: waits on them
            batches = self._waiting(self._iterator, super().__iter__)
        elif not self.num_workers and not self.pin_memory:
            # In one process the dataset's own batches: torch's iterator only adds a profiler
            # range and a sampler step a batch, ~65 µs (docs/benchmarks.md#one-process).
            batches = iter(dataset)
        else:
            batches = super().__iter__()
        if self.num_workers:
            batches = self._in_order(batches, counts, done)
        batches = passes.skipping(batches, progress)  # (before any copy to a device)
        if self.device is not None and self.device.type != "cpu":
            copied = to_device(batches, self.device)
            batches = dataset.clock.timed_less(copied, DEVICE, (READ, MAKE, QUEUE, UNPACK))
        if self._gradient_state is not None:
            batches = tracked(self, batches, self._gradient_state)
        if not self.num_workers:
            batches = _collected(batches, dataset.failure_log, self._read_failures)
        if dataset.cache_stats is not None:
            batches = self._cache_counted(batches, progress.pass_.epoch)
        # The loop's exposed wait for each batch, and the clock as the pass begins (`metrics`).
        waits = self._metrics.begin(progress.pass_.epoch, started, dataset)
        counted = passes.counted(waits.timed(batches), progress)
        self._reader = Reader.of(self, sys._getframe(1), counted)
        return counted

    def _in_order(self, iterator: Any, counts: list[int], done: list[int]) -> Iterator[Any]:
        """The batches of the workers' messages in DataLoader's order (`in_order`)."""
        clock = self.dataset.clock
        unpack = Unbundler(self.dataset.finish, self._read_failures, clock)
        try:
            messages = clock.timed(self._watched(iterator), QUEUE)
            yield from in_order(messages, counts, done, unpack)
        except Exception:
            # The exception's traceback keeps the iterator alive; without this, its workers
            # would wait for the garbage collector and then 5 s each to be killed.
            if not self.persistent_workers:
                shut_down(iterator)
            raise
        finally:
            forget_exited_workers()  # their buffers stay mapped here until then


_END = object()


def _collected(
    batches: Iterator[Any], log: FailureLog, failures: list[ReadFailure]
) -> Iterator[Any]:
    """``batches``, collecting the reads skipped in this process before each is handed out."""
    for batch in batches:
        failures.extend(log.drain())
        yield batch
    failures.extend(log.drain())
