"""The loader state: where an epoch stands, small and versioned.

See docs/concepts/checkpointing.md.

A state holds no row lists: the epoch, the batches this rank delivered, the plan fingerprint,
the topology and the layout that ordered the rows, and, after elastic resumes inside the epoch,
the same for each earlier leg. Everything else follows from the plan (pure functions).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import get_worker_info

from .errors import StateMismatchError
from .planning import Layout, Leg, Plan

__all__ = [
    "STATE_VERSION",
    "STREAM_STATE_KIND",
    "Iteration",
    "PassControl",
    "decode_state",
    "decode_stream_state",
    "encode_state",
    "encode_stream_state",
]

STATE_VERSION = 1
_KIND = "torch_dataloader_utils.loader_state"
# The state of one DataLoader worker's stream (torchdata's StatefulDataLoader keeps one per worker).
STREAM_STATE_KIND = "torch_dataloader_utils.stream_state"

# Slots of the shared control tensor.
_EPOCH = 0  # the epoch set, or of the pass begun last
_GENERATION = 1  # passes begun by the main process
_ADVANCE = 2  # 1: the next pass reads _EPOCH + 1 (a pass delivered a batch since set_epoch)
_FOR_WORKERS = 3  # passes the main process began for its DataLoader workers to follow
WORKER_SLOTS = 256
_NEXT = 4  # per worker: 1 + the epoch its next pass of its own reads (0: unset)
_FOLLOWED = _NEXT + WORKER_SLOTS  # per worker: the last _FOR_WORKERS pass it followed


@dataclass(frozen=True, slots=True)
class Iteration:
    """One pass over an epoch, as the main process begins it.

    Attributes:
        epoch: the epoch.
        legs: earlier legs of this epoch (each an elastic resume's old topology).
        batches: batches this rank already delivered in the current leg (a resume).
        generation: counts passes in the main process; workers use it to tell whether their
            copy of this object describes the pass they are asked for.
    """

    epoch: int
    legs: tuple[Leg, ...] = ()
    batches: int = 0
    generation: int = 0

    @property
    def resumed(self) -> bool:
        """Whether the pass starts anywhere but the beginning of a fresh epoch."""
        return bool(self.legs or self.batches)


def _plan_facts(plan: Plan) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "fingerprint": plan.fingerprint,
        "rows": plan.num_rows,
        "chunks": len(plan.chunks),
        "files": len({c.path for c in plan.chunks}),
        "file_versions": plan.files_digest,
    }
    snapshot = dict(plan.details).get("snapshot_id")
    if snapshot not in (None, "None"):  # a table read at a pinned snapshot (Iceberg)
        facts["snapshot_id"] = snapshot
    return facts


def _leg(data: dict[str, Any]) -> Leg:
    return Leg(
        world_size=int(data["world_size"]),
        num_workers=int(data["num_workers"]),
        layout=Layout(**data["layout"]),
        batches=int(data["batches"]),
    )


def encode_state(
    plan: Plan,
    iteration: Iteration,
    *,
    world_size: int,
    num_workers: int,
    layout: Layout,
    complete: bool,
) -> dict[str, Any]:
    """The state of ``iteration`` as plain Python values (for ``torch.save``, JSON, ...).

    It is the same on every rank (ranks deliver equal batch counts), so any rank's copy resumes
    them all, and ranks that save to one path (as accelerate's ``save_state`` does) write the
    same bytes.
    """
    return {
        "kind": _KIND,
        "version": STATE_VERSION,
        "epoch": iteration.epoch,
        "batches": iteration.batches,
        "complete": complete,
        "topology": {"world_size": world_size, "num_workers": num_workers},
        "layout": dataclasses.asdict(layout),
        "legs": [
            {
                "world_size": leg.world_size,
                "num_workers": leg.num_workers,
                "layout": dataclasses.asdict(leg.layout),
                "batches": leg.batches,
            }
            for leg in iteration.legs
        ],
        "plan": _plan_facts(plan),
    }


def _check_plan(saved: dict[str, Any], plan: Plan) -> None:
    now = _plan_facts(plan)
    if saved.get("fingerprint") == now["fingerprint"] and saved.get("file_versions") in (
        None,  # a state saved before versions were pinned
        now["file_versions"],
    ):
        return
    changes = [
        f"{key}: {saved.get(key)} then, {now[key]} now"
        for key in ("rows", "chunks", "files")
        if saved.get(key) != now[key]
    ]
    if not changes and saved.get("fingerprint") == now["fingerprint"]:
        changes = [
            "the same files and counts, but files were rewritten since (their sizes, ETags, "
            "generations or modification times differ; a copy that did not keep modification "
            "times, like cp without -p, looks rewritten too)"
        ]
    changes = changes or ["the same counts, but other files, row groups, columns or filter"]
    hint = ""
    snapshot = saved.get("snapshot_id")
    if snapshot is not None and snapshot != now.get("snapshot_id"):
        hint = (
            f"The table was read at snapshot {snapshot} then, {now.get('snapshot_id')} now: "
            f"pass snapshot_id={snapshot} (and the same from_snapshot_id, for an incremental "
            "read) to read the snapshot the state was saved at. "
        )
    raise StateMismatchError(
        f"the state was saved for plan {saved.get('fingerprint')} and the data now plans as "
        f"{now['fingerprint']} ({'; '.join(changes)}). {hint}Resuming would lose or repeat "
        "rows; pass allow_changed_data=True to load_state_dict to resume at the same epoch and "
        "batch anyway"
    )


def decode_state(
    state: dict[str, Any],
    plan: Plan,
    *,
    world_size: int,
    num_workers: int,
    layout: Layout,
    allow_changed_data: bool = False,
) -> Iteration:
    """The pass that resumes ``state`` on this topology.

    The same world size, workers per rank and layout continue the same streams; anything
    else is an elastic resume: the state's topology becomes a leg, and what it left of the
    epoch is dealt to the new streams.

    Raises:
        StateMismatchError: not a state of this library, a newer version, other data (unless
            ``allow_changed_data``), or an elastic resume of ``split_strategy="round_robin"``.
    """
    try:
        return _decode(
            state,
            plan,
            world_size=world_size,
            num_workers=num_workers,
            layout=layout,
            allow_changed_data=allow_changed_data,
        )
    except StateMismatchError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateMismatchError(
            f"malformed loader state: {exc!r} (expected the dict that loader.state_dict() "
            "returns, unchanged)"
        ) from exc


def _decode(
    state: dict[str, Any],
    plan: Plan,
    *,
    world_size: int,
    num_workers: int,
    layout: Layout,
    allow_changed_data: bool,
) -> Iteration:
    if not isinstance(state, dict) or state.get("kind") != _KIND:
        raise StateMismatchError(
            "not a torch_dataloader_utils loader state (expected the dict that "
            "loader.state_dict() returns)"
        )
    version = state.get("version")
    if version != STATE_VERSION:
        raise StateMismatchError(
            f"loader state version {version} is not {STATE_VERSION}, the version this library reads"
        )
    if not allow_changed_data:
        _check_plan(state["plan"], plan)
    legs = tuple(_leg(leg) for leg in state["legs"])
    saved = Leg(
        world_size=int(state["topology"]["world_size"]),
        num_workers=int(state["topology"]["num_workers"]),
        layout=Layout(**state["layout"]),
        batches=int(state["batches"]),
    )
    epoch = int(state["epoch"])
    # A complete epoch resumes at its end (its pass yields nothing): set_epoch(epoch) in a
    # training loop's first turn must not read it again, set_epoch(epoch + 1) goes on.
    if (saved.world_size, saved.num_workers, saved.layout) == (world_size, num_workers, layout):
        return Iteration(epoch, legs, saved.batches)
    # A topology that delivered nothing is no leg: it consumed no rows.
    legs = (*legs, saved) if saved.batches else legs
    for leg in (*legs, Leg(world_size, num_workers, layout, 0)) if legs else ():
        if leg.layout.strategy != "equal":
            raise StateMismatchError(
                f'split_strategy="{leg.layout.strategy}" resumes only on the same topology and '
                f"options (saved: {saved.world_size} ranks x {saved.num_workers} workers, "
                f"{saved.layout}; now: {world_size} x {num_workers}, {layout})"
            )
    return Iteration(epoch, legs, 0)


def encode_stream_state(
    plan: Plan,
    iteration: Iteration,
    *,
    world_size: int,
    num_workers: int,
    worker: int,
    batches: int,
    layout: Layout,
    complete: bool,
) -> dict[str, Any]:
    """The state of one DataLoader worker's stream (the dataset's ``state_dict`` in a worker).

    ``batches``: the batches this stream delivered in the pass, counted from the start of its
    leg. torchdata's ``StatefulDataLoader`` keeps one such state per worker and gives each back
    to the same worker on resume.
    """
    state = encode_state(
        plan,
        iteration,
        world_size=world_size,
        num_workers=num_workers,
        layout=layout,
        complete=complete,
    )
    state.update(kind=STREAM_STATE_KIND, worker=worker, stream_batches=batches)
    return state


def decode_stream_state(
    state: dict[str, Any],
    plan: Plan,
    *,
    world_size: int,
    num_workers: int,
    worker: int,
    layout: Layout,
) -> tuple[Iteration, int]:
    """The pass a worker's stream state resumes, and the batches its stream already delivered.

    Raises:
        StateMismatchError: not a stream state of this version, other data, or another
            topology (a worker's state describes one stream of one topology).
    """
    if not isinstance(state, dict) or state.get("kind") != STREAM_STATE_KIND:
        raise StateMismatchError(
            "not a torch_dataloader_utils stream state (what the dataset's state_dict returns "
            "in a DataLoader worker)"
        )
    try:
        saved = (int(state["topology"]["world_size"]), int(state["topology"]["num_workers"]))
        saved_worker, batches = int(state["worker"]), int(state["stream_batches"])
    except (KeyError, TypeError, ValueError) as exc:  # no StateMismatchError can come here
        raise StateMismatchError(f"malformed stream state: {exc!r} is missing or invalid") from exc
    if saved != (world_size, num_workers):
        raise StateMismatchError(
            f"this worker state was saved with {saved[0]} ranks x {saved[1]} DataLoader workers "
            f"and is loaded into {world_size} x {num_workers}: a StatefulDataLoader gives each "
            "worker its own saved state back, so it resumes only with the same number of "
            "workers and ranks. Resume with those, or read through tdu.create_dataloader, "
            "whose state_dict resumes on any number of ranks and workers"
        )
    if saved_worker != worker:
        raise StateMismatchError(
            f"worker {worker} was given the state of worker {saved_worker}: each worker "
            "resumes its own stream"
        )
    as_loader_state = {**state, "kind": _KIND}
    iteration = decode_state(
        as_loader_state, plan, world_size=world_size, num_workers=num_workers, layout=layout
    )
    if iteration.batches != int(state["batches"]):
        raise StateMismatchError(
            "this worker state was saved with other options (batch size, shuffle, seed, "
            "drop_last or remainder): a worker's state resumes only the same stream"
        )
    return iteration, batches


class PassControl:
    """The epoch and the pass counters that one rank's copies of a dataset share.

    The main process and its DataLoader workers (fork, spawn or forkserver, persistent or not)
    see one tensor in shared memory, so ``set_epoch`` reaches persistent workers and workers
    of a plain ``DataLoader`` learn which epoch their pass reads. The rule (ADR 0009):

    - ``set_epoch(e)``: the next pass reads epoch ``e``; an explicit epoch always wins.
    - A pass that begins without ``set_epoch`` since a pass that delivered a batch reads the
      next epoch (as MosaicML Streaming does): a trainer that never calls ``set_epoch``
      (Lightning, a plain loop) still gets a new order each epoch.

    The tensor belongs to one process (its owner). A copy that lands in another process's main
    role (a loader pickled or forked into a rank by ``mp.spawn``, Lightning's ``ddp_spawn`` or Ray)
    takes counters of its own at first use; a DataLoader worker uses its parent's, and private
    ones when its parent never claimed them, so two ranks never share pass counters.
    """

    def __init__(self) -> None:
        self._tensor = self._new(torch.zeros(_NEXT + 2 * WORKER_SLOTS, dtype=torch.int64))
        self._owner = os.getpid()

    @staticmethod
    def _new(values: torch.Tensor) -> torch.Tensor:
        shared: torch.Tensor = values.share_memory_()  # type: ignore[no-untyped-call]
        return shared

    def _values(self) -> torch.Tensor:
        pid = os.getpid()
        if self._owner == pid:
            return self._tensor
        if get_worker_info() is None:
            # Main role in a process that did not create these counters: take our own.
            self._tensor, self._owner = self._new(self._tensor.clone()), pid
            return self._tensor
        parent = multiprocessing.parent_process()
        if parent is None or parent.pid != self._owner:
            # A worker whose rank never touched the counters it received (a dataset pickled
            # into a rank and wrapped in a plain DataLoader): private, not a sibling rank's.
            self._tensor, self._owner = self._tensor.clone(), pid
        return self._tensor

    @property
    def epoch(self) -> int:
        """The epoch set, or of the pass begun last."""
        return int(self._values()[_EPOCH])

    @property
    def generation(self) -> int:
        """Passes the main process has begun."""
        return int(self._values()[_GENERATION])

    def set_epoch(self, epoch: int, *, advance: bool = False) -> None:
        """The next pass reads ``epoch`` (``epoch + 1`` with ``advance``)."""
        values = self._values()
        values[_EPOCH] = epoch
        values[_ADVANCE] = int(advance)
        values[_NEXT:_FOLLOWED] = 0

    def begin(self, *, for_workers: bool) -> tuple[int, int]:
        """Begin a pass in the main process: its epoch and generation.

        ``for_workers``: its DataLoader workers follow this pass (a `TabularDataLoader`'s).
        """
        values = self._values()
        if int(values[_ADVANCE]):
            values[_EPOCH] += 1
            values[_ADVANCE] = 0
            values[_NEXT:_FOLLOWED] = 0
        values[_GENERATION] += 1
        if for_workers:
            values[_FOR_WORKERS] += 1
        return int(values[_EPOCH]), int(values[_GENERATION])

    def delivered(self) -> None:
        """A pass delivered a batch: the next pass reads the next epoch unless set_epoch."""
        self._values()[_ADVANCE] = 1

    def begin_worker(self, worker: int, epoch: int | None = None) -> int | None:
        """Begin a pass in DataLoader worker ``worker``: its epoch, or None to follow the pass
        the main process began for its workers.

        ``epoch`` (a loaded worker state) wins. A worker of a plain ``DataLoader`` (no main
        process begins its passes) reads the epoch after its own last pass, else the main
        process's next one. Each worker writes only its own slots.
        """
        values = self._values()
        if not 0 <= worker < WORKER_SLOTS:
            if epoch is None and int(values[_FOR_WORKERS]):
                return None
            return int(values[_EPOCH]) + int(values[_ADVANCE]) if epoch is None else epoch
        passes = int(values[_FOR_WORKERS])
        if epoch is None and passes != int(values[_FOLLOWED + worker]):
            values[_FOLLOWED + worker] = passes
            return None
        if epoch is None:
            following = int(values[_NEXT + worker])
            epoch = following - 1 if following else int(values[_EPOCH]) + int(values[_ADVANCE])
        values[_NEXT + worker] = epoch + 2
        return epoch
