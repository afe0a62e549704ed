"""The loader state: where an epoch stands, small and versioned.

See docs/concepts/checkpointing.md.

A state holds no row lists: the epoch, the batches this rank delivered, the plan fingerprint,
the topology and the layout that ordered the rows, and, after elastic resumes inside the epoch,
the same for each earlier leg. Everything else follows from the plan (pure functions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..errors import StateMismatchError
from ..planning import Iteration, Layout, Leg, Pass, Plan
from . import keys as k

__all__ = [
    "RESUME_ANYWAY",
    "STATE_VERSION",
    "STREAM_STATE_KIND",
    "Iteration",
    "Pass",
    "decode_layout",
    "decode_state",
    "decode_stream_state",
    "encode_state",
    "encode_stream_state",
    "is_complete",
    "read_failures",
    "with_read_failures",
]

# The way past a changed plan, told with the refusal (a caller with no load_state_dict, such as
# `tdu explain`, leaves it out).
RESUME_ANYWAY = (
    "; pass allow_changed_data=True to load_state_dict to resume at the same epoch and batch anyway"
)

STATE_VERSION = 1
_KIND = "torch_dataloader_utils.loader_state"
# The state of one DataLoader worker's stream (torchdata's StatefulDataLoader keeps one per worker).
STREAM_STATE_KIND = "torch_dataloader_utils.stream_state"


def _plan_facts(plan: Plan) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "fingerprint": plan.fingerprint,
        "rows": plan.num_rows,
        "chunks": len(plan.chunks),
        "files": len(plan.chunks.paths),
        "file_versions": plan.files_digest,
    }
    details = dict(plan.details)
    # A table read at a pinned snapshot (Iceberg) or version (Delta, Lance); files at a Hub commit.
    for pinned in _PINNED:
        if details.get(pinned) not in (None, "None"):
            facts[pinned] = details[pinned]
    for made in _DERIVED:  # a source tokenized or transformed in the loader
        if made in details:
            facts[made] = details[made]
    return facts


# What pins the version of a source's data, by its plan details' key (`sources.tables`).
_PINNED = ("snapshot_id", "version", "commit")

# What a source computes from its rows, by the fingerprint a state names it by; and how
# batches are handed to ranks (`batching.Balance.identity`).
_DERIVED = ("tokenizer", "transform", "balance")


def decode_layout(data: Any, where: str) -> Layout:
    """The `Layout` a state holds (``where``: what it is, for the refusal), some fields under
    their saved keys (`keys.LAYOUT_SAVED_AS`).

    Raises:
        StateMismatchError: a key is missing or unknown.
    """
    saved = {k.LAYOUT_SAVED_AS.get(f.name, f.name): f for f in dataclasses.fields(Layout)}
    optional = {key for key, f in saved.items() if f.default is not dataclasses.MISSING}
    values = k.checked(data, set(saved) - optional, where, optional)
    return Layout(**{saved[key].name: value for key, value in values.items()})


def _layout_state(layout: Layout) -> dict[str, Any]:
    """``layout`` as a state holds it (`keys.LAYOUT_SAVED_AS`)."""
    values = dataclasses.asdict(layout)
    return {k.LAYOUT_SAVED_AS.get(name, name): value for name, value in values.items()}


def _leg(data: Any) -> Leg:
    leg = k.checked(data, k.LEG_KEYS, "a leg", k.LEG_OPTIONAL)
    return Leg(
        world_size=int(leg[k.WORLD_SIZE]),
        num_workers=int(leg[k.NUM_WORKERS]),
        layout=decode_layout(leg[k.LAYOUT], "a leg's layout"),
        batches=int(leg[k.BATCHES]),
        skips=tuple((int(a), int(b)) for a, b in leg.get(k.SKIPS, ())),
    )


def encode_state(
    plan: Plan,
    pass_: Pass,
    *,
    world_size: int,
    num_workers: int,
    layout: Layout,
    complete: bool,
) -> dict[str, Any]:
    """The state of ``pass_`` as plain Python values (for ``torch.save``, JSON, ...).

    It is the same on every rank (ranks deliver equal batch counts), so any rank's copy resumes
    them all, and ranks that save to one path (as accelerate's ``save_state`` does) write the
    same bytes.
    """
    state = {
        k.KIND: _KIND,
        k.VERSION: STATE_VERSION,
        k.EPOCH: pass_.epoch,
        k.BATCHES: pass_.batches,
        k.COMPLETE: complete,
        k.TOPOLOGY: {k.WORLD_SIZE: world_size, k.NUM_WORKERS: num_workers},
        k.LAYOUT: _layout_state(layout),
        k.LEGS: [
            {
                k.WORLD_SIZE: leg.world_size,
                k.NUM_WORKERS: leg.num_workers,
                k.LAYOUT: _layout_state(leg.layout),
                k.BATCHES: leg.batches,
                **({k.SKIPS: [list(r) for r in leg.skips]} if leg.skips else {}),
            }
            for leg in pass_.legs
        ],
        k.PLAN: _plan_facts(plan),
    }
    if pass_.steps != (0, 0):
        state[k.STEPS] = list(pass_.steps)
    return state


def with_read_failures(state: dict[str, Any], failures: int, rows: int) -> dict[str, Any]:
    """``state`` counting the reads skipped under ``on_error="skip"`` (``failures`` of them,
    ``rows`` rows replaced): this rank's, since the loader was built or loaded."""
    state[k.READ_FAILURES] = {"failures": failures, "rows": rows}
    return state


def is_complete(state: Mapping[str, Any]) -> bool:
    """Whether ``state`` was taken after its epoch's last batch."""
    return bool(state.get(k.COMPLETE))


def read_failures(state: Mapping[str, Any]) -> tuple[int, int]:
    """The ``(failures, rows)`` a state counts (zeros for a state without the count).

    Raises:
        StateMismatchError: the count is malformed.
    """
    if k.READ_FAILURES not in state:
        return 0, 0
    counted = k.checked(state[k.READ_FAILURES], k.READ_FAILURE_KEYS, "read_failures")
    try:
        return int(counted["failures"]), int(counted["rows"])
    except (TypeError, ValueError) as exc:
        raise StateMismatchError(f"malformed loader state: read_failures {exc}") from exc


def _check_plan(saved: dict[str, Any], plan: Plan) -> None:
    now = _plan_facts(plan)
    if saved.get("fingerprint") not in (None, now["fingerprint"]):
        # A state saved by a version that fingerprinted plans otherwise (chunk by chunk, or
        # over Parquet's names of a schema's children): computed only for such a state.
        for earlier in plan.earlier_fingerprints():
            if saved.get("fingerprint") == earlier:
                now["fingerprint"] = earlier
                break
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
    version = saved.get("version")
    if version is not None and version != now.get("version"):
        hint += (
            f"The table was read at version {version} then, {now.get('version')} now: pass "
            f"version={version} to read the version the state was saved at. "
        )
    commit = saved.get("commit")
    if commit is not None and commit != now.get("commit"):
        hint += (
            f"The files were read at commit {commit} then, {now.get('commit')} now: put "
            f"@{commit} in the path (hf://datasets/<repo>@{commit}/...) to read the files "
            "the state was saved at. "
        )
    for made in _DERIVED:
        if saved.get(made) != now.get(made) and "fingerprint" in saved:
            then, here = saved.get(made) or "none", now.get(made) or "none"
            hint += (
                f"The state was saved with another {made}: fingerprint {then} then, {here} "
                f"now; resume with the {made} it was saved with. "
            )
    raise StateMismatchError(
        f"the state was saved for plan {saved.get('fingerprint')} and the data now plans as "
        f"{now['fingerprint']} ({'; '.join(changes)}). {hint}Resuming would lose or repeat "
        f"rows{RESUME_ANYWAY}"
    )


def decode_state(
    state: dict[str, Any],
    plan: Plan,
    *,
    world_size: int,
    num_workers: int,
    layout: Layout,
    allow_changed_data: bool = False,
) -> Pass:
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
) -> Pass:
    if not isinstance(state, dict) or state.get(k.KIND) != _KIND:
        raise StateMismatchError(
            "not a torch_dataloader_utils loader state (expected the dict that "
            "loader.state_dict() returns)"
        )
    version = state.get(k.VERSION)
    if version != STATE_VERSION:
        raise StateMismatchError(
            f"loader state version {version} is not {STATE_VERSION}, the version this library reads"
        )
    allowed = k.STREAM_KEYS if state.get(k.WORKER) is not None else k.LOADER_KEYS
    k.checked(state, allowed, "the state", k.LOADER_OPTIONAL)
    facts = k.checked(state[k.PLAN], k.PLAN_KEYS, "plan", k.PLAN_OPTIONAL)
    if not allow_changed_data:
        _check_plan(dict(facts), plan)
    if not isinstance(state[k.LEGS], list | tuple):
        raise StateMismatchError("malformed loader state: legs is not a list")
    legs = tuple(_leg(leg) for leg in state[k.LEGS])
    topology = k.checked(state[k.TOPOLOGY], k.TOPOLOGY_KEYS, "topology")
    saved = Leg(
        world_size=int(topology[k.WORLD_SIZE]),
        num_workers=int(topology[k.NUM_WORKERS]),
        layout=decode_layout(state[k.LAYOUT], "layout"),
        batches=int(state[k.BATCHES]),
    )
    epoch = int(state[k.EPOCH])
    steps = _steps(state)
    # A complete epoch resumes at its end (its pass yields nothing): set_epoch(epoch) in a
    # training loop's first turn must not read it again, set_epoch(epoch + 1) goes on.
    if (saved.world_size, saved.num_workers, saved.layout) == (world_size, num_workers, layout):
        return Pass(epoch, legs, saved.batches, steps=steps)
    # A topology that delivered nothing is no leg: it consumed no rows.
    legs = (*legs, saved) if saved.batches else legs
    for leg in (*legs, Leg(world_size, num_workers, layout, 0)) if legs else ():
        if leg.layout.strategy != "equal":
            raise StateMismatchError(
                f'split_strategy="{leg.layout.strategy}" resumes only on the same topology and '
                f"options (saved: {saved.world_size} ranks x {saved.num_workers} workers, "
                f"{saved.layout}; now: {world_size} x {num_workers}, {layout})"
            )
    return Pass(epoch, legs, 0, steps=steps)


def _steps(state: dict[str, Any]) -> tuple[int, int]:
    """The ``(world_size, batch_size)`` a weights schedule counts steps in (`Pass`)."""
    steps = state.get(k.STEPS, (0, 0))
    if (
        not isinstance(steps, list | tuple)
        or len(steps) != 2
        or not all(isinstance(x, int) and x >= 0 for x in steps)
    ):
        raise StateMismatchError(f"malformed loader state: steps is {steps!r}, not [int, int]")
    return int(steps[0]), int(steps[1])


def encode_stream_state(
    plan: Plan,
    pass_: Pass,
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
        pass_,
        world_size=world_size,
        num_workers=num_workers,
        layout=layout,
        complete=complete,
    )
    state.update({k.KIND: STREAM_STATE_KIND, k.WORKER: worker, k.STREAM_BATCHES: batches})
    return state


def decode_stream_state(
    state: dict[str, Any],
    plan: Plan,
    *,
    world_size: int,
    num_workers: int,
    worker: int,
    layout: Layout,
) -> tuple[Pass, int]:
    """The pass a worker's stream state resumes, and the batches its stream already delivered.

    Raises:
        StateMismatchError: not a stream state of this version, other data, or another
            topology (a worker's state describes one stream of one topology).
    """
    if not isinstance(state, dict) or state.get(k.KIND) != STREAM_STATE_KIND:
        raise StateMismatchError(
            "not a torch_dataloader_utils stream state (what the dataset's state_dict returns "
            "in a DataLoader worker)"
        )
    try:
        topology = k.checked(state[k.TOPOLOGY], k.TOPOLOGY_KEYS, "topology")
        saved = (int(topology[k.WORLD_SIZE]), int(topology[k.NUM_WORKERS]))
        saved_worker, batches = int(state[k.WORKER]), int(state[k.STREAM_BATCHES])
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
    as_loader_state = {**state, k.KIND: _KIND}
    pass_ = decode_state(
        as_loader_state, plan, world_size=world_size, num_workers=num_workers, layout=layout
    )
    if pass_.batches != int(state[k.BATCHES]):
        raise StateMismatchError(
            "this worker state was saved with other options (batch size, shuffle, seed, "
            "drop_last or remainder): a worker's state resumes only the same stream"
        )
    return pass_, batches
