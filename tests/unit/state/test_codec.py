"""The loader state: plain, small, versioned; exact and elastic resume; refusals that explain."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re

import pyarrow as pa
import pytest

from torch_dataloader_utils.errors import InvalidArgumentError, StateMismatchError
from torch_dataloader_utils.planning import (
    Chunk,
    Chunks,
    Layout,
    Leg,
    Plan,
    epoch_sequence,
    sequence_length,
)
from torch_dataloader_utils.state import (
    STATE_VERSION,
    Pass,
    decode_state,
    encode_state,
    read_failures,
    with_read_failures,
)

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float32())])
LAYOUT = Layout(
    batch_size=4,
    shuffle=True,
    seed=7,
    drop_last=False,
    remainder="drop",
    block_rows=64,
    first_block_rows=8,
)


def make_plan(*chunks: tuple[str, int], filtered_rows=None) -> Plan:
    """A plan of ``(path, rows)`` chunks; chunks of one path are consecutive row groups."""
    seen: dict[str, int] = {}
    out = []
    for path, rows in chunks:
        start = seen.get(path, 0)
        seen[path] = start + 1
        out.append(Chunk(path, start, start + 1, rows, rows * 8, (rows,)))
    return Plan(chunks=Chunks.of(out), schema=SCHEMA, row_bytes=8.0, filtered_rows=filtered_rows)


PLAN = make_plan(("a.parquet", 40), ("a.parquet", 25), ("b.parquet", 35))


def encode(
    pass_: Pass, *, plan=PLAN, world_size=2, num_workers=3, layout=LAYOUT, complete=False
) -> dict:
    return encode_state(
        plan,
        pass_,
        world_size=world_size,
        num_workers=num_workers,
        layout=layout,
        complete=complete,
    )


def decode(state, *, plan=PLAN, world_size=2, num_workers=3, layout=LAYOUT, **kwargs):
    return decode_state(
        state, plan, world_size=world_size, num_workers=num_workers, layout=layout, **kwargs
    )


def through_json(state: dict) -> dict:
    return json.loads(json.dumps(state))


# --- the state itself -------------------------------------------------------------------------


def test_state_is_plain_small_and_versioned():
    legs = tuple(
        Leg(w, n, dataclasses.replace(LAYOUT, batch_size=b), k)
        for w, n, b, k in ((4, 2, 8, 3), (3, 1, 5, 11), (1, 4, 2, 2))
    )
    state = encode(Pass(5, legs, 9, generation=3))
    text = json.dumps(state)  # plain Python values only
    assert len(text) < 2000
    assert json.loads(text) == state
    assert pickle.loads(pickle.dumps(state)) == state
    assert state["version"] == STATE_VERSION
    assert state["epoch"] == 5
    assert state["batches"] == 9
    assert state["complete"] is False
    # The same on every rank (ranks deliver equal batches): no rank in it.
    assert state["topology"] == {"world_size": 2, "num_workers": 3}
    assert len(state["legs"]) == 3
    assert "generation" not in text  # process-local, not part of where the epoch stands


def test_state_holds_no_row_lists_whatever_the_data_size():
    big = make_plan(*((f"part-{i:05d}.parquet", 10**6) for i in range(2000)))
    state = encode(Pass(0, (Leg(64, 8, LAYOUT, 10**5),), 10**4), plan=big)
    assert len(json.dumps(state)) < 2000


def test_a_layouts_seq_tokens_is_saved_under_its_earlier_key():
    """``Layout.seq_tokens`` was ``unit`` when states were first saved: a state keeps that key
    (states saved before resume, and states saved now are read by earlier versions)."""
    packed = dataclasses.replace(LAYOUT, seq_tokens=16)
    state = through_json(encode(Pass(2, (Leg(1, 1, packed, 3),), 1), layout=packed))
    assert state["layout"]["unit"] == 16 and "seq_tokens" not in state["layout"]
    assert state["legs"][0]["layout"]["unit"] == 16
    got = decode(state, layout=packed)
    assert got.legs[0].layout == packed and packed.unit == 16  # (the earlier name, read-only)


def test_pass_resumed():
    assert not Pass(0).resumed
    assert not Pass(4, generation=2).resumed
    assert Pass(0, batches=1).resumed
    assert Pass(0, legs=(Leg(1, 1, LAYOUT, 0),)).resumed


# --- exact resume: the same topology continues the same streams --------------------------------


@pytest.mark.parametrize("batches", [0, 1, 17])
def test_same_topology_continues_the_same_streams(batches):
    legs = (Leg(4, 1, dataclasses.replace(LAYOUT, batch_size=2), 6),)
    for pass_ in (Pass(3, (), batches), Pass(3, legs, batches)):
        state = through_json(encode(pass_))
        got = decode(state)
        assert (got.epoch, got.legs, got.batches) == (3, pass_.legs, batches)


def test_complete_state_resumes_at_the_end_of_its_epoch():
    """Not as the next epoch: a loop calling set_epoch(saved epoch) would drop it, re-reading."""
    # 100 rows on 2 ranks x 3 workers, batches of 4: 50 rows = 13 batches per rank.
    state = through_json(encode(Pass(3, (), 13), complete=True))
    same = decode(state, world_size=2, num_workers=3)
    assert (same.epoch, same.legs, same.batches) == (3, (), 13)
    other = decode(state, world_size=5, num_workers=1)
    assert (other.epoch, other.batches) == (3, 0)
    assert other.legs == (Leg(2, 3, LAYOUT, 13),)
    # Nothing of the epoch is left for the new topology.
    assert sequence_length(epoch_sequence(PLAN.num_rows, other.legs, epoch=3)) == 0


# --- elastic resume: another topology or layout adds a leg --------------------------------------


@pytest.mark.parametrize(
    ("world_size", "num_workers", "layout"),
    [
        (4, 3, LAYOUT),
        (2, 1, LAYOUT),
        (1, 8, LAYOUT),
        (2, 3, dataclasses.replace(LAYOUT, batch_size=5)),
        (2, 3, dataclasses.replace(LAYOUT, shuffle=False)),
        (2, 3, dataclasses.replace(LAYOUT, remainder="pad", drop_last=True)),
    ],
)
def test_other_topology_adds_the_saved_one_as_a_leg(world_size, num_workers, layout):
    first = Leg(4, 2, dataclasses.replace(LAYOUT, batch_size=3), 5)
    for legs in ((), (first,)):
        state = through_json(encode(Pass(2, legs, 7)))
        got = decode(state, world_size=world_size, num_workers=num_workers, layout=layout)
        assert got.epoch == 2
        assert got.batches == 0
        assert got.legs == (*legs, Leg(2, 3, LAYOUT, 7))
        # The new pass reads what the legs left: fewer rows than the epoch.
        rest = sum(item.num_rows for item in epoch_sequence(PLAN.num_rows, got.legs, epoch=2))
        assert rest < PLAN.num_rows


def test_legs_grow_by_one_per_elastic_resume():
    pass_ = Pass(1)
    topologies = [(2, 3, LAYOUT), (4, 1, LAYOUT), (1, 2, dataclasses.replace(LAYOUT, seed=1))]
    for step, (ws, nw, layout) in enumerate(topologies[1:], start=1):
        saved_ws, saved_nw, saved_layout = topologies[step - 1]
        pass_ = dataclasses.replace(pass_, batches=2)
        state = through_json(
            encode(pass_, world_size=saved_ws, num_workers=saved_nw, layout=saved_layout)
        )
        pass_ = decode(state, world_size=ws, num_workers=nw, layout=layout)
        assert len(pass_.legs) == step
        assert pass_.legs[-1] == Leg(saved_ws, saved_nw, saved_layout, 2)
    assert len(json.dumps(encode(pass_, world_size=1, num_workers=2))) < 2000


def test_other_topology_before_any_batch_starts_the_epoch_afresh():
    state = through_json(encode(Pass(6, (), 0)))
    got = decode(state, world_size=8, num_workers=1)
    assert (got.epoch, got.legs, got.batches) == (6, (), 0)


# --- split_strategy="round_robin": exact resume only --------------------------------------------

ROUND_ROBIN = dataclasses.replace(LAYOUT, strategy="round_robin", remainder="uneven")


def test_round_robin_resumes_exactly():
    state = through_json(encode(Pass(1, (), 5), layout=ROUND_ROBIN))
    got = decode(state, layout=ROUND_ROBIN)
    assert (got.epoch, got.legs, got.batches) == (1, (), 5)


@pytest.mark.parametrize(
    ("saved", "now", "world_size"),
    [
        (ROUND_ROBIN, ROUND_ROBIN, 4),  # other ranks
        (ROUND_ROBIN, LAYOUT, 2),  # to the equal strategy
        (LAYOUT, ROUND_ROBIN, 2),  # from the equal strategy
    ],
)
def test_round_robin_refuses_elastic_resume(saved, now, world_size):
    state = through_json(encode(Pass(1, (), 5), layout=saved))
    with pytest.raises(StateMismatchError, match='split_strategy="round_robin"') as info:
        decode(state, world_size=world_size, layout=now)
    assert "same topology" in str(info.value)
    # An epoch not begun needs no elastic resume.
    fresh = through_json(encode(Pass(1, (), 0), layout=saved))
    assert decode(fresh, world_size=world_size, layout=now) == Pass(1)


def test_round_robin_leg_refuses_elastic_resume():
    legs = (Leg(3, 1, ROUND_ROBIN, 2),)
    state = through_json(encode(Pass(1, legs, 5)))
    with pytest.raises(StateMismatchError, match="round_robin"):
        decode(state, world_size=5)


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [None, [], "state", {}, {"kind": "other"}, {"epoch": 0, "batches": 3}],
    ids=["none", "list", "str", "empty", "other-kind", "no-kind"],
)
def test_not_a_state_is_refused(state):
    with pytest.raises(StateMismatchError, match="not a torch_dataloader_utils loader state"):
        decode(state)


@pytest.mark.parametrize("version", [STATE_VERSION + 1, 0, None, "1"])
def test_other_version_is_refused(version):
    state = encode(Pass(0, (), 1))
    state["version"] = version
    if version is None:
        del state["version"]
    with pytest.raises(StateMismatchError, match="version") as info:
        decode(state)
    assert str(version) in str(info.value)
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("now", "changes"),
    [
        (
            make_plan(("a.parquet", 40), ("a.parquet", 25), ("b.parquet", 36)),
            ["rows: 100 then, 101 now"],
        ),
        (
            make_plan(("a.parquet", 40), ("a.parquet", 25), ("b.parquet", 35), ("c.parquet", 3)),
            ["rows: 100 then, 103 now", "chunks: 3 then, 4 now", "files: 2 then, 3 now"],
        ),
        (
            make_plan(("a.parquet", 65), ("b.parquet", 35)),
            ["chunks: 3 then, 2 now"],
        ),
        (
            make_plan(("a.parquet", 40), ("c.parquet", 25), ("b.parquet", 35)),
            ["files: 2 then, 3 now"],
        ),
        (
            make_plan(
                ("a.parquet", 40), ("a.parquet", 25), ("b.parquet", 35), filtered_rows=(1, 2, 3)
            ),
            ["rows: 100 then, 6 now"],
        ),
        (
            make_plan(("a.parquet", 40), ("a.parquet", 25), ("c.parquet", 35)),
            ["the same counts"],
        ),
    ],
    ids=["rows", "rows-chunks-files", "chunks", "files", "filter", "same-counts"],
)
def test_other_data_is_refused_naming_what_changed(now, changes):
    state = through_json(encode(Pass(2, (), 4)))
    assert now.fingerprint != PLAN.fingerprint
    with pytest.raises(StateMismatchError) as info:
        decode(state, plan=now)
    message = str(info.value)
    for change in changes:
        assert change in message
    for key in {"rows", "chunks", "files"} - {c.split(":")[0] for c in changes}:
        assert f"{key}:" not in message
    assert PLAN.fingerprint in message and now.fingerprint in message
    assert "allow_changed_data=True" in message
    # The user may accept the change: same epoch and batch.
    got = decode(state, plan=now, allow_changed_data=True)
    assert (got.epoch, got.legs, got.batches) == (2, (), 4)


def test_same_data_planned_again_is_accepted():
    again = make_plan(("a.parquet", 40), ("a.parquet", 25), ("b.parquet", 35))
    assert again.fingerprint == PLAN.fingerprint
    assert decode(through_json(encode(Pass(0, (), 3))), plan=again).batches == 3


def test_allow_changed_data_does_not_skip_the_version_check():
    state = encode(Pass(0, (), 1))
    state["version"] = STATE_VERSION + 1
    with pytest.raises(StateMismatchError, match="version"):
        decode(state, allow_changed_data=True)
    with pytest.raises(StateMismatchError, match="not a torch_dataloader_utils"):
        decode({"kind": "x"}, allow_changed_data=True)


def _versioned(plan: Plan, version: str, size: int = 100) -> Plan:
    files = {c.path: (size, version) for c in plan.chunks}
    return dataclasses.replace(plan, files=files)


def test_files_rewritten_since_the_state_are_refused_naming_the_rewrite():
    saved = _versioned(PLAN, "mtime=1.0")
    state = through_json(encode(Pass(2, (), 4), plan=saved))
    for now in (_versioned(PLAN, "mtime=2.0"), _versioned(PLAN, "mtime=1.0", size=101)):
        assert now.fingerprint == saved.fingerprint and now.files_digest != saved.files_digest
        with pytest.raises(StateMismatchError, match="files were rewritten since"):
            decode(state, plan=now)
        assert decode(state, plan=now, allow_changed_data=True).batches == 4
    assert decode(state, plan=_versioned(PLAN, "mtime=1.0")).batches == 4


def test_a_state_saved_with_the_earlier_fingerprint_resumes():
    # States saved before the columnar plan carry the fingerprint computed chunk by chunk.
    state = through_json(encode(Pass(2, (), 4)))
    state["plan"]["fingerprint"] = PLAN.legacy_fingerprint()
    assert PLAN.legacy_fingerprint() != PLAN.fingerprint
    assert decode(state).batches == 4
    state["plan"]["fingerprint"] = "0123456789abcdef"
    with pytest.raises(StateMismatchError, match="0123456789abcdef"):
        decode(state)


def test_a_state_saved_before_files_were_pinned_resumes():
    state = through_json(encode(Pass(2, (), 4)))
    del state["plan"]["file_versions"]
    assert decode(state, plan=_versioned(PLAN, "mtime=2.0")).batches == 4


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda s: s.pop("legs"), "missing ['legs']"),
        (lambda s: s.pop("topology"), "missing ['topology']"),
        (lambda s: s["plan"].pop("fingerprint"), "plan has keys missing ['fingerprint']"),
        (lambda s: s.update(extra=1), "unknown ['extra']"),
        (lambda s: s["layout"].update(colour="red"), "layout has keys unknown ['colour']"),
        (lambda s: s["topology"].update(ranks=2), "topology has keys unknown ['ranks']"),
        (lambda s: s.update(layout=[1, 2]), "layout is a list, not a mapping"),
        (lambda s: s.update(read_failures={"failures": 1}), "read_failures has keys missing"),
    ],
    ids=[
        "no-legs",
        "no-topology",
        "no-fingerprint",
        "extra",
        "layout-key",
        "topology-key",
        "layout-list",
        "read-failures",
    ],
)
def test_a_malformed_state_is_refused_saying_which_key(change, said):
    state = through_json(encode(Pass(2, (), 4)))
    if "read_failures" in said:
        change(state)
        with pytest.raises(StateMismatchError, match=re.escape(said)):
            read_failures(state)
        return
    change(state)
    with pytest.raises(StateMismatchError, match=re.escape(said)):
        decode(state)
    with pytest.raises(StateMismatchError):  # whatever the data, a malformed state is refused
        decode(state, allow_changed_data=True)


def test_the_read_failure_count_travels_in_the_state():
    state = through_json(with_read_failures(encode(Pass(2, (), 4)), 3, 150))
    assert read_failures(state) == (3, 150)
    assert decode(state).batches == 4
    assert read_failures(through_json(encode(Pass(2, (), 4)))) == (0, 0)


@pytest.mark.parametrize(
    ("key", "then", "now", "hint"),
    [
        ("version", "1", "2", "pass version=1 to read the version"),
        ("commit", "a" * 40, "b" * 40, f"put @{'a' * 40} in the path"),
        ("snapshot_id", "11", "12", "pass snapshot_id=11"),
    ],
)
def test_a_state_saved_at_another_version_names_the_one_to_pass(key, then, now, hint):
    saved = dataclasses.replace(PLAN, details=Plan.details_of(**{key: then}))
    state = through_json(encode(Pass(1, (), 2), plan=saved))
    assert state["plan"][key] == then
    later = dataclasses.replace(PLAN, details=Plan.details_of(**{key: now}))
    with pytest.raises(StateMismatchError) as info:
        decode(state, plan=later)
    assert hint in str(info.value) and f"{then} then, {now} now" in str(info.value)
    assert decode(state, plan=saved).batches == 2
