"""A mixture's weights on a schedule, planning (pure), by brute force over small cases: every
step's batch holds its phase's shares, each source continues its own order across phases and
epochs with no position read twice, and a phase holds the same rows on any topology."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning import Layout, Leg, Pass, Topology, consumed
from torch_dataloader_utils.planning.mixture import Mixture, quotas
from torch_dataloader_utils.planning.phases import PhasedInterleave
from torch_dataloader_utils.planning.resume import delivery_order
from torch_dataloader_utils.planning.schedule import Schedule
from torch_dataloader_utils.planning.streams import Mixed


def mixed(
    rows,
    schedule,
    epoch_rows,
    *,
    batch_size,
    mixing="stratified",
    seq_tokens=0,
    shuffle=True,
    **layout,
) -> Mixed:
    """A mixture's streams (``seq_tokens``: a packed one's, of sequences of that many
    positions)."""
    chunk_rows = tuple(np.full(r // 5, 5) for r in rows)
    s = Schedule.of(schedule, len(rows))
    u = max(1, seq_tokens)
    first = tuple(u * q for q in quotas([r // u for r in rows], s.weights[0], epoch_rows // u))
    options = {"drop_last": False, "remainder": "drop", **layout}
    return Mixed(
        Mixture(chunk_rows, first, mixing, s),
        Layout(
            batch_size * u,
            shuffle,
            3,
            options["drop_last"],
            options["remainder"],
            40,
            8,
            seq_tokens=seq_tokens,
        ),
    )


def delivered(streams: Mixed, epoch: int, world_size: int, workers: int, steps=(0, 0)):
    """Each rank's batches in delivered order, as (source labels, source positions), and each
    source's positions (absolute in its passes) the epoch reads."""
    pass_ = Pass(epoch, steps=steps)
    batches: dict[tuple[int, int], np.ndarray] = {}
    positions: list[Counter[int]] = [Counter() for _ in streams.mixture.chunk_rows]
    for rank in range(world_size):
        counts, _ = streams.rank_streams(pass_, Topology(rank, world_size, 0, workers))
        own = []
        for worker in range(workers):
            stream = streams.resolve(pass_, Topology(rank, world_size, worker, workers), done=0)
            for i, source in enumerate(stream.sources):
                first, _, total = source.order._passes
                for run in source.runs:
                    positions[i].update(first * total + x for x in range(run.start, run.stop))
            labels = stream.interleave.labels(stream.first, stream.first + stream.length)
            size = streams.layout.batch_size
            own.append([labels[k * size : (k + 1) * size] for k in range(stream.batches)])
        taken = [0] * workers
        for b, worker in enumerate(delivery_order(counts, [0] * workers)):
            batches[rank, b] = own[worker][taken[worker]]
            taken[worker] += 1
    return batches, positions


CASES = [
    # rows of each source, schedule, epoch_rows, batch_size
    ((500, 300), [(0, [3, 1]), (7, [1, 1])], 400, 10),
    ((500, 300, 200), [(0, [1, 0, 1]), (3, [1, 1, 1]), (9, [0, 2, 1])], 333, 7),
    ((90, 60), [(0, [1, 1]), (2, [1, 3]), (5, [3, 1]), (26, [1, 1])], 240, 8),
]


@pytest.mark.parametrize("rows,schedule,epoch_rows,batch_size", CASES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_step_holds_its_phases_shares_and_sources_go_on_in_order(
    rows, schedule, epoch_rows, batch_size, world_size, workers
) -> None:
    streams = mixed(rows, schedule, epoch_rows, batch_size=batch_size, remainder="uneven")
    plan = Schedule.of(schedule, len(rows))
    steps = streams.rank_batches(Topology(0, world_size), 0)
    read: list[Counter[int]] = [Counter() for _ in rows]
    for epoch in range(4):
        batches, positions = delivered(streams, epoch, world_size, workers)
        for (rank, b), labels in batches.items():
            weights = np.asarray(plan.weights[plan.phase_at(epoch * steps + b)])
            share = len(labels) * weights / weights.sum()
            counts = np.bincount(labels, minlength=len(rows))
            assert np.all(np.abs(counts - share) <= 2), (epoch, rank, b, counts, share)
        for i, got in enumerate(positions):
            assert max(got.values(), default=1) == 1  # no position twice in an epoch
            read[i].update(got)
    for i, got in enumerate(read):
        # Each source's positions, over the epochs, are its sequence from 0 on, once each.
        assert sorted(got) == list(range(len(got))), i
        assert max(got.values()) == 1


@pytest.mark.parametrize("seed", range(12))
def test_a_phase_holds_the_same_rows_on_any_topology(seed: int) -> None:
    rng = random.Random(seed)
    rows = (rng.randint(20, 90) * 5, rng.randint(20, 90) * 5)
    batch_size = rng.randint(2, 9)
    saved = rng.randint(1, 4), batch_size
    schedule = [(0, [1, 1]), (rng.randint(1, 12), [rng.randint(0, 3), rng.randint(1, 3)])]
    layout = {"remainder": rng.choice(["uneven", "drop", "pad"]), "drop_last": rng.random() < 0.3}
    mixing = rng.choice(["stratified", "random"])
    streams = mixed(
        rows, schedule, rng.randint(100, 400), batch_size=batch_size, mixing=mixing, **layout
    )
    reference = None
    for world_size, workers in [(saved[0], 1), (rng.randint(1, 4), rng.randint(1, 3)), (3, 2)]:
        per_epoch = []
        for epoch in range(3):
            mix = streams.mixture.epoch(
                streams.layout, epoch, (), readers=(world_size, workers), steps=saved
            )
            assert mix.phases is not None
            per_epoch.append((mix.phases.counts, mix.phases.offsets))
            # The current leg's interleave holds each phase's counts.
            assert list(mix.current.counts) == list(mix.phases.quotas)
            _, positions = delivered(streams, epoch, world_size, workers, steps=saved)
            for i, got in enumerate(positions):
                offset, quota = mix.phases.offsets[i], mix.phases.quotas[i]
                if layout["remainder"] != "pad":
                    assert max(got.values(), default=1) == 1
                assert all(offset <= x < offset + quota for x in got) or quota == 0
        if reference is None:
            reference = per_epoch
        assert per_epoch == reference  # the same rows of each source in each phase


@pytest.mark.parametrize("seed", range(16))
def test_an_elastic_resume_inside_a_change_reads_every_row_once(seed: int) -> None:
    """Leg 0 delivers some steps on one topology; the rest of the epoch, on another, reads
    each source's other positions once, and its phases hold what leg 0 left of each."""
    rng = random.Random(seed)
    rows = (rng.randint(30, 90) * 5, rng.randint(30, 90) * 5)
    batch_size = rng.randint(2, 7)
    schedule = [(0, [1, 1]), (rng.randint(1, 8), [rng.randint(0, 3), rng.randint(1, 3)])]
    streams = mixed(
        rows,
        schedule,
        rng.randint(150, 400),
        batch_size=batch_size,
        shuffle=False,
        remainder="uneven",
        mixing=rng.choice(["stratified", "random"]),
    )
    (w0, n0), (w1, n1) = [(rng.randint(1, 4), rng.randint(1, 3)) for _ in range(2)]
    steps = streams.rank_batches(Topology(0, w0), 0)
    done = rng.randint(1, max(1, steps - 1))
    fresh = Pass(0, steps=(w0, batch_size))
    read: list[Counter[int]] = [Counter(), Counter()]
    for rank in range(w0):
        counts, _ = streams.rank_streams(fresh, Topology(rank, w0, 0, n0))
        for worker, batches in enumerate(consumed(counts, done)):
            stream = streams.resolve(fresh, Topology(rank, w0, worker, n0), done=0)
            at = stream.first + min(batches * batch_size, stream.length)
            got = stream.interleave.prefix(at) - stream.interleave.prefix(stream.first)
            for i, source in enumerate(stream.sources):
                positions = [x for run in source.runs for x in range(run.start, run.stop)]
                read[i].update(positions[: int(got[i])])
    legs = (Leg(w0, n0, streams.layout, done),)
    after = Pass(0, legs, steps=(w0, batch_size))
    mix = streams.mixture.epoch(streams.layout, 0, legs, readers=(w1, n1), steps=(w0, batch_size))
    for rank in range(w1):
        for worker in range(n1):
            stream = streams.resolve(after, Topology(rank, w1, worker, n1), done=0)
            for i, source in enumerate(stream.sources):
                read[i].update(x for run in source.runs for x in range(run.start, run.stop))
    quotas_ = mix.sources[0].quota, mix.sources[1].quota
    for i, got in enumerate(read):
        assert sorted(got) == list(range(quotas_[i])), i  # every position of the epoch once
        assert max(got.values(), default=1) == 1
    # The new leg's phases hold, of each source, what is left of it.
    assert list(mix.current.counts) == [sum(r.num_rows for r in x) for x in mix.items]


@pytest.mark.parametrize("world_size,workers", [(1, 1), (2, 2), (3, 1)])
def test_a_packed_mixtures_phases_are_whole_sequences(world_size: int, workers: int) -> None:
    seq_tokens = 4
    streams = mixed(
        (400, 240),
        [(0, [1, 1]), (3, [1, 3])],
        320,
        batch_size=2,
        seq_tokens=seq_tokens,
        remainder="uneven",
    )
    steps = streams.rank_batches(Topology(0, world_size), 0)
    read: list[Counter[int]] = [Counter(), Counter()]
    for epoch in range(3):
        batches, positions = delivered(streams, epoch, world_size, workers)
        for (_, b), labels in batches.items():
            runs = labels.reshape(-1, seq_tokens)
            assert np.all(runs == runs[:, :1])  # each sequence one source's
            if epoch * steps + b >= 3:  # 1:3 by sequences, within a sequence or two
                assert abs(np.sum(runs[:, 0] == 1) - 0.75 * len(runs)) <= 2
        for i, got in enumerate(positions):
            read[i].update(got)
    for got in read:
        assert sorted(got) == list(range(len(got))) and max(got.values()) == 1


@pytest.mark.parametrize("seq_tokens", [0, 4])
@pytest.mark.parametrize("mixing", ["random", "stratified"])
def test_a_phased_interleaves_prefixes_are_each_positions_prefix(seq_tokens: int, mixing) -> None:
    streams = mixed(
        (400, 240),
        [(0, [1, 1]), (3, [1, 3])],
        320,
        batch_size=2,
        seq_tokens=seq_tokens,
        mixing=mixing,
    )
    mix = streams.mixture.epoch(streams.layout, 0, (), readers=(2, 3), steps=(2, 0))
    inter = mix.current
    assert isinstance(inter, PhasedInterleave)
    positions = range(2 * inter.total + 3)
    assert inter.prefixes(positions).tolist() == [inter.prefix(t).tolist() for t in positions]


@pytest.mark.parametrize(
    "given,message",
    [
        ([(5, [1, 1])], "begin at step 0"),
        ([], "begin at step 0"),
        ([(0, [1, 1]), (0, [1, 2])], "increasing"),
        ([(0, [1, 1]), (3, [1])], "1 weights for 2 sources"),
        ([(0, [1, -1])], ">= 0"),
        ([(0, [0, 0])], "not all 0"),
        ([(0, [1, float("nan")])], "finite"),
        ("3:1", "list of"),
        ([(0.5, [1, 1])], "begin at step 0"),
    ],
)
def test_bad_schedules_are_refused(given, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Schedule.of(given, 2)
