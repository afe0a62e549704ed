"""Planning once per job, over the ranks (`Spread`): rank 0 takes the steps every rank receives
the result of, and each rank reads a share of the files.

Planning a large source on object storage can take longer than a collective may wait (listing
and reading a million footers: tens of minutes; the default process-group timeout is 10 minutes
for NCCL, 30 for gloo). So the ranks do not wait for rank 0 inside the broadcast: rank 0 plans,
then sets a key in the default process group's store (a few bytes: "planned" or "failed"); the
other ranks poll that key (`Store.check`, no collective, no timeout of the group's) for up to
`PLAN_TIMEOUT_ENV` seconds, logging while they wait, and only then join the broadcast, which
carries the plan (or rank 0's error) and completes as fast as the bytes travel.

Why the store and not a broadcast on a group made with a long ``timeout=``: the default group's
store already exists on every rank and a key costs one small request per poll, whatever the
backend; a new group costs every rank a connection to every other (gloo's full mesh: 4,095
sockets per rank at 4,096 ranks) per dataset built. The plan itself never goes through the
store (a TCPStore value is limited to 8 MiB, and one server would send it to every rank).
The ranks poll with ``check`` (`_pause`: soon at first, at most a second apart) rather than
block in ``wait``: a ``wait`` that times out to let a rank log makes torch print two C++
warnings each time.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import torch.distributed as dist

from ..errors import InvalidArgumentError, PlanTimeoutError

__all__ = ["PLAN_TIMEOUT_ENV", "Gathered", "Spread", "plan_timeout"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")

# Seconds the other ranks wait for rank 0 to plan, from this environment variable.
PLAN_TIMEOUT_ENV = "TDU_PLAN_TIMEOUT"
# Six hours: three times what a million files on object storage take to plan
# (docs/adr/0020-measurements-behind-constants.md#planning-time). The wait
# only matters when rank 0 is stuck without dying (a dead rank 0 ends the job under torchrun,
# and its store's connections when it hosts the store).
_DEFAULT_TIMEOUT = 6 * 3600.0
# Waiting ranks poll the key after a tenth of the time waited so far (`_pause`), so that a rank
# learns at most about 10% late (pauses that doubled from 10 ms learned of a key set at 0.39 s
# at 0.63 s; docs/benchmarks.md#planning-reads-each-footer-in-the-next-free-thread); never
# sooner than _POLL_MIN, times the ranks over _POLL_RANKS (all the ranks' polls come to the
# store at most ~6,400 a second), never later than _POLL_MAX. They log every _LOG_EVERY.
_POLL_MIN = 0.01
_POLL_RANKS = 64
_POLL_SHARE = 0.1
_POLL_MAX = 1.0
_LOG_EVERY = 30.0
_READY = b"planned"
_FAILED = b"failed"

# Every rank takes the steps of a `Spread` in the same order (every rank builds every dataset),
# so the n-th step of each process names the same key. A restarted job gets a new store
# (torchelastic creates one per attempt), so keys of a previous attempt are never seen.
_calls = itertools.count()


def plan_timeout() -> float:
    """Seconds a rank waits for rank 0's plan: ``$TDU_PLAN_TIMEOUT``, or six hours.

    Raises:
        InvalidArgumentError: the variable is not a positive number of seconds.
    """
    text = os.environ.get(PLAN_TIMEOUT_ENV, "").strip()
    if not text:
        return _DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:  # (also NaN)
        raise InvalidArgumentError(
            f"{PLAN_TIMEOUT_ENV}={text!r}: expected a positive number of seconds (how long the "
            "other ranks wait for rank 0 to plan the source)"
        )
    return seconds


def _from_rank0(make: Callable[[], T], store: Any, timeout: float, ranks: int) -> T:
    """`Spread.from_rank0` in a process group of several ranks."""
    key = f"torch_dataloader_utils/plan/{next(_calls)}"
    box: list[object] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", make())
        except Exception as exc:
            box[0] = ("error", _portable(exc))
            _announce(store, key, _FAILED)
            dist.broadcast_object_list(box, src=0)
            raise
        _announce(store, key, _READY)
        dist.broadcast_object_list(box, src=0)
        logger.debug("plan broadcast from rank 0")
    else:
        if store is not None:
            _await(store, key, timeout, ranks)
        dist.broadcast_object_list(box, src=0)
    kind, value = cast(tuple[str, Any], box[0])
    if kind == "error":
        raise value
    return cast(T, value)


class Gathered(list[tuple[str, Any]]):
    """What each rank's share of some work gave (`Spread.share`), in rank order."""

    def values(self) -> list[Any]:
        """Every rank's results, concatenated in rank order.

        Raises:
            Exception: the first rank's error, if any rank failed.
        """
        out: list[Any] = []
        for kind, value in self:
            if kind == "error":
                raise value
            out.extend(value)
        return out


class Spread:
    """Planning over the ranks of the default process group: steps rank 0 takes for every rank
    (`from_rank0`) and work each rank does a share of (`share`). Without a group of several
    ranks (or with an ``explicit`` rank), both run here.

    Listing files and reading footers once instead of once per rank spares the storage (and,
    with many ranks, the planning time); every rank gets the same plan by construction. It
    applies when ``torch.distributed`` is initialised and the rank was not passed explicitly
    (explicit ranks may be a data-parallel subgroup that not every process builds). Every rank
    of the group must build the dataset, as every rank of a DDP job does.
    """

    def __init__(self, *, explicit: bool) -> None:
        self.active = (
            not explicit
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        )
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1
        # On every rank: a bad value fails before any collective.
        self._timeout = plan_timeout() if self.active else 0.0
        self._store = _default_store() if self.active else None

    def from_rank0(self, make: Callable[[], T]) -> T:
        """``make()`` on rank 0, its value (or error) on every rank.

        The other ranks wait for rank 0 outside any collective, for up to
        ``$TDU_PLAN_TIMEOUT`` seconds (six hours by default), so a planning longer than the
        process group's timeout completes. An error on rank 0 is raised on every rank, so no
        rank is left waiting.

        Raises:
            PlanTimeoutError: (ranks other than 0) rank 0 did not finish within the timeout.
            Exception: rank 0's error, on every rank.
        """
        if not self.active:
            return make()
        return _from_rank0(make, self._store, self._timeout, self.world_size)

    def share(self, items: Sequence[T], work: Callable[[Sequence[T]], list[U]]) -> Gathered:
        """``work`` of each rank's share of ``items`` (a contiguous range, by rank), gathered on
        rank 0 (the others get nothing back). A rank that fails sends its error instead; rank
        0 raises it with `Gathered.values`, inside its next `from_rank0`, so every rank learns.

        The ranks wait for each other outside any collective (a count in the store, for up to
        ``$TDU_PLAN_TIMEOUT`` seconds), then gather.
        """
        if not self.active:
            return Gathered([("ok", work(items))])
        n = len(items)
        mine = items[n * self.rank // self.world_size : n * (self.rank + 1) // self.world_size]
        try:
            box: tuple[str, Any] = ("ok", work(mine))
        except Exception as exc:
            box = ("error", _portable(exc))
        key = f"torch_dataloader_utils/share/{next(_calls)}"
        if self._store is not None:
            self._store.add(key, 1)
            _await_count(self._store, key, self.world_size, self._timeout)
        got: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(box, got, dst=0)
        return Gathered(got or [])


def _await_count(store: Any, key: str, count: int, timeout: float) -> None:
    """Poll the counter ``key`` until ``count`` ranks added to it.

    Raises:
        PlanTimeoutError: not within ``timeout`` seconds.
    """
    start = time.monotonic()
    while (done := int(store.add(key, 0))) < count:
        waited = time.monotonic() - start
        if waited >= timeout:
            raise PlanTimeoutError(
                f"rank {dist.get_rank()}: {count - done} of {count} ranks did not finish their "
                f"share of planning within {timeout:.0f} s; set {PLAN_TIMEOUT_ENV} (seconds) to "
                "wait longer"
            )
        time.sleep(min(_pause(waited, count), timeout - waited))


def _pause(waited: float, ranks: int) -> float:
    """Seconds a rank that has waited ``waited`` seconds, one of ``ranks`` polling the store,
    sleeps before it polls again."""
    floor = _POLL_MIN * max(1.0, ranks / _POLL_RANKS)
    return min(_POLL_MAX, max(floor, _POLL_SHARE * waited))


def _default_store() -> Any:
    """The default process group's store, or ``None`` where torch offers none (the ranks then
    wait inside the broadcast, under the group's timeout)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, KeyError, ValueError, RuntimeError):
        logger.debug("no default store: the ranks wait for the plan inside the broadcast")
        return None


def _announce(store: Any, key: str, value: bytes) -> None:
    if store is not None:
        store.set(key, value)


def _await(store: Any, key: str, timeout: float, ranks: int = 1) -> None:
    """Poll ``key`` until rank 0 sets it, logging every `_LOG_EVERY` seconds (``ranks``: the
    ranks polling it).

    Raises:
        PlanTimeoutError: not set within ``timeout`` seconds.
    """
    rank = dist.get_rank()
    start = time.monotonic()
    logged = start
    while not store.check([key]):
        now = time.monotonic()
        waited = now - start
        if waited >= timeout:
            raise PlanTimeoutError(
                f"rank {rank}: rank 0 did not finish planning the source within {timeout:.0f} "
                f"s; set {PLAN_TIMEOUT_ENV} (seconds) to wait longer, or look at rank 0's log "
                "for its progress"
            )
        if now - logged >= _LOG_EVERY:
            logged = now
            logger.info(
                "rank %d: waiting for rank 0 to plan the source (%.0f s so far, at most %.0f s: "
                "%s)",
                rank,
                waited,
                timeout,
                PLAN_TIMEOUT_ENV,
            )
        time.sleep(min(_pause(waited, ranks), timeout - waited))
    logger.debug("rank %d: rank 0 planned after %.1f s", rank, time.monotonic() - start)


def _portable(exc: Exception) -> Exception:
    """``exc`` if it pickles, else a RuntimeError with its message."""
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"planning failed on rank 0: {type(exc).__name__}: {exc}")
    return exc
