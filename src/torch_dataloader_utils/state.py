"""The loader state: where an epoch stands, small and versioned.

See docs/concepts/checkpointing.md.

A state holds no row lists: the epoch, the batches this rank delivered, the plan fingerprint,
the topology and the layout that ordered the rows, and, after elastic resumes inside the epoch,
the same for each earlier leg. Everything else follows from the plan (pure functions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import StateMismatchError
from .planning import Layout, Leg, Plan

__all__ = ["STATE_VERSION", "Iteration", "decode_state", "encode_state"]

STATE_VERSION = 1
_KIND = "torch_dataloader_utils.loader_state"


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
    if saved.get("fingerprint") == now["fingerprint"]:
        return
    changes = [
        f"{key}: {saved.get(key)} then, {now[key]} now"
        for key in ("rows", "chunks", "files")
        if saved.get(key) != now[key]
    ] or ["the same counts, but other files, row groups, columns or filter"]
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
