"""Mixtures, planning (pure): quotas, the interleave, and the streams cut from a mixture's
epoch, checked by brute force against the definitions of docs/concepts/mixtures.md."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning import Layout, Leg, Pass, Topology, consumed
from torch_dataloader_utils.planning import interleave as il
from torch_dataloader_utils.planning import mixture as mx
from torch_dataloader_utils.planning.interleave import Interleave
from torch_dataloader_utils.planning.mixture import Mixture, quotas
from torch_dataloader_utils.planning.streams import Mixed


def merged(counts: list[int]) -> list[int]:
    """The definition: every source's keys (2j + 1) / (2 q_i) sorted, ties by source."""
    keys = sorted((Fraction(2 * j + 1, 2 * q), i) for i, q in enumerate(counts) for j in range(q))
    return [i for _, i in keys]


# --- quotas ---------------------------------------------------------------------------------


def test_without_weights_or_epoch_rows_every_row_once() -> None:
    assert quotas([10, 0, 7], None, None) == [10, 0, 7]


@pytest.mark.parametrize("seed", range(20))
def test_quotas_add_up_and_are_the_largest_remainders(seed: int) -> None:
    rng = random.Random(seed)
    k = rng.randint(1, 6)
    rows = [rng.randint(1, 1000) for _ in range(k)]
    weights = [rng.choice([0, 1, 2, 3, 0.5, 7.25]) for _ in range(k)]
    if not any(weights):
        weights[0] = 1
    epoch_rows = rng.randint(0, 5000)
    got = quotas(rows, weights, epoch_rows)
    assert sum(got) == epoch_rows
    exact = [
        Fraction(epoch_rows) * Fraction(w) / sum(Fraction(x) for x in weights) for w in weights
    ]
    for q, e in zip(got, exact, strict=True):
        assert abs(q - e) < 1  # floor or ceil of the exact share
    # Largest remainders: a source rounded up has a remainder at least as large as any rounded
    # down (ties: the earlier source).
    up = [i for i, (q, e) in enumerate(zip(got, exact, strict=True)) if q > e]
    down = [i for i, (q, e) in enumerate(zip(got, exact, strict=True)) if q < e]
    for i in up:
        for j in down:
            assert exact[i] % 1 >= exact[j] % 1


def test_weights_without_epoch_rows_split_all_rows() -> None:
    assert quotas([100, 300], [1, 1], None) == [200, 200]
    assert quotas([100, 300], [3, 1], 8) == [6, 2]


@pytest.mark.parametrize(
    ("rows", "weights", "epoch_rows", "message"),
    [
        ([1, 2], [1, -1], 5, "weights must be finite"),
        ([1, 2], [0, 0], 5, "weight above 0"),
        ([1, 2], [1], 5, "1 weights for 2 sources"),
        ([0, 2], [1, 1], 5, "source 0 has no rows"),
        ([1, 2], [1, 1], -1, "epoch_rows must be >= 0"),
    ],
)
def test_bad_quotas_are_refused(rows, weights, epoch_rows, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        quotas(rows, weights, epoch_rows)


# --- the interleave -------------------------------------------------------------------------


def random_counts(rng: random.Random) -> list[int]:
    k = rng.randint(1, 4)
    counts = [rng.choice([0, 1, 2, 3, 5, 7, 10, 31, 64, 100]) for _ in range(k)]
    if not sum(counts):
        counts[0] = 3
    return counts


@pytest.mark.parametrize("window", [5, 16, 1 << 14])
@pytest.mark.parametrize("seed", range(12))
def test_window_counts_are_the_exact_merge(
    monkeypatch: pytest.MonkeyPatch, window: int, seed: int
) -> None:
    monkeypatch.setattr(il, "WINDOW", window)
    rng = random.Random(seed)
    counts = random_counts(rng)
    reference = merged(counts)
    total = sum(counts)
    for mixing in ("random", "stratified"):
        inter = Interleave(counts, mixing, seed=seed, epoch=3)
        labels = inter.labels(0, total)
        assert Counter(labels.tolist()) == Counter(reference)
        # Exact at every window boundary; consistent with the labels everywhere, wrapping too.
        for t in range(0, total + 1, window):
            assert (
                inter.prefix(t).tolist()
                == np.bincount(reference[:t], minlength=len(counts)).tolist()
            )
        wrapped = inter.labels(0, 2 * total + 3)
        for t in range(2 * total + 4):
            expect = np.bincount(wrapped[:t].astype(int), minlength=len(counts))
            assert inter.prefix(t).tolist() == expect.tolist()
        if mixing == "stratified" and window >= total:
            assert labels.tolist() == reference  # one window: the merge itself


@pytest.mark.parametrize("seed", range(20))
def test_merged_counts_are_the_merges_counts_at_every_t(seed: int) -> None:
    counts = random_counts(random.Random(seed))
    reference = merged(counts)
    ts = list(range(-2, sum(counts) + 3))
    expect = [np.bincount(reference[: max(t, 0)], minlength=len(counts)).tolist() for t in ts]
    assert il.merged_counts(counts, ts).tolist() == expect


@pytest.mark.parametrize("counts", [[3_000_000_000, 2_000_000_001, 7], [900_000_007, 5, 0, 8]])
def test_merged_counts_of_large_sources_are_exact(counts: list[int]) -> None:
    # (The first's products pass int64: counted in Python integers.) At window edges a
    # prefix is the merge's counts, one position at a time.
    inter = Interleave(counts, "random", seed=0, epoch=0)
    total, w = sum(counts), il.WINDOW
    ts = [0, w, 7 * w, (total // 3) // w * w, (total - 1) // w * w, total]
    assert il.merged_counts(counts, ts).tolist() == [inter.prefix(t).tolist() for t in ts]


@pytest.mark.parametrize("mixing", il.MIXINGS)
@pytest.mark.parametrize("turn", [1, 3])
def test_prefixes_are_each_positions_prefix(
    monkeypatch: pytest.MonkeyPatch, mixing: il.Mixing, turn: int
) -> None:
    monkeypatch.setattr(il, "WINDOW", 16)  # many windows, some positions sharing one
    rng = random.Random(turn)
    for counts in [*(random_counts(rng) for _ in range(12)), [0, 0]]:
        inter = Interleave([turn * c for c in counts], mixing, seed=2, epoch=1, leg=1, turn=turn)
        positions = [rng.randrange(3 * inter.total + 1) for _ in range(30)]
        positions += list(range(0, 2 * inter.total + 2, 5))
        got = inter.prefixes(positions).tolist()
        assert got == [inter.prefix(t).tolist() for t in positions]


@pytest.mark.parametrize("seed", range(30))
def test_stratified_batches_hold_each_share_within_two_rows(seed: int) -> None:
    rng = random.Random(seed)
    counts = [rng.randint(1, 3000) for _ in range(rng.randint(2, 5))]
    total = sum(counts)
    batch = rng.choice([8, 32, 100, 1024])
    inter = Interleave(counts, "stratified", seed=0, epoch=0)
    labels = inter.labels(0, total)
    for start in range(0, total - batch + 1, batch):
        got = np.bincount(labels[start : start + batch], minlength=len(counts))
        share = np.asarray(counts) * batch / total
        assert np.all(np.abs(got - share) < 2), (counts, batch, start, got, share)


def test_random_batches_vary_but_each_window_holds_its_share() -> None:
    counts = [30_000, 10_000]
    inter = Interleave(counts, "random", seed=1, epoch=0)
    labels = inter.labels(0, sum(counts))
    per_batch = [np.bincount(labels[s : s + 64], minlength=2)[1] for s in range(0, 40_000, 64)]
    assert len(set(per_batch)) > 5  # drawn at random, not stratified
    assert abs(np.mean(per_batch) - 16) < 0.5
    w = il.WINDOW
    for start in range(0, 40_000 - w, w):
        got = np.bincount(labels[start : start + w], minlength=2)
        assert np.all(np.abs(got - np.asarray(counts) * w / 40_000) < 2)


def test_interleaves_differ_by_epoch_and_leg_only_for_random() -> None:
    counts = [500, 300]
    a = Interleave(counts, "random", seed=1, epoch=0).labels(0, 800)
    b = Interleave(counts, "random", seed=1, epoch=1).labels(0, 800)
    c = Interleave(counts, "random", seed=1, epoch=0, leg=1).labels(0, 800)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    s0 = Interleave(counts, "stratified", seed=1, epoch=0).labels(0, 800)
    s1 = Interleave(counts, "stratified", seed=2, epoch=5).labels(0, 800)
    assert np.array_equal(s0, s1)


def test_an_unknown_mixing_names_the_known_ones() -> None:
    with pytest.raises(InvalidArgumentError, match=r"random.*stratified"):
        Interleave([1], "uniform", seed=0, epoch=0)  # type: ignore[arg-type]


# --- the streams of a mixture's epoch -------------------------------------------------------


def layout(
    batch: int, *, shuffle: bool, drop_last: bool = False, remainder: str = "drop"
) -> Layout:
    return Layout(
        batch_size=batch,
        shuffle=shuffle,
        seed=5,
        drop_last=drop_last,
        remainder=remainder,  # type: ignore[arg-type]
        block_rows=2 * batch,
        first_block_rows=batch,
    )


def pass_sequence(
    chunk_rows: list[int], source: int, passes: int, shuffle: bool
) -> list[tuple[int, int]]:
    """The definition of a source's endless sequence: pass p is every chunk's rows, chunks in
    the order (seed, source, p) gives; rows named (chunk, row)."""
    out = []
    for p in range(passes):
        order = mx.source_order(len(chunk_rows), seed=5, source=source, passes=p, shuffle=shuffle)
        out += [(int(c), r) for c in order for r in range(chunk_rows[c])]
    return out


def stream_rows(mix, a: int, b: int) -> list[Counter]:
    """Rows (chunk, row) of each source that positions [a, b) of the leg hold."""
    out = []
    for i, runs in enumerate(mix.source_runs(a, b)):
        epoch = mix.source_epoch(i)
        rows: Counter = Counter()
        for run in runs:
            pieces, select = epoch.run_pieces(run)
            flat = [(p.chunk, r) for p in pieces for r in range(p.start, p.stop)]
            rows.update(flat if select is None else [flat[s] for s in select])
        out.append(rows)
    return out


CASES = list(
    itertools.product(
        [([5, 0, 7, 3], [2, 2]), ([40], [1, 9, 3]), ([3, 3], [50])],  # (source 0, source 1) chunks
        [None, 30, 97],  # epoch_rows
        [1, 2, 3, 4],  # ranks
        [1, 2, 3],  # workers
    )
)


@pytest.mark.parametrize(("sources", "epoch_rows", "ranks", "workers"), CASES)
def test_streams_read_each_sources_quota_once_and_ranks_are_equal(
    sources, epoch_rows, ranks, workers
) -> None:
    rows = [sum(s) for s in sources]
    q = quotas(rows, [2, 1], epoch_rows) if epoch_rows else rows
    mixture = Mixture(tuple(np.asarray(s) for s in sources), tuple(q), "stratified")
    for shuffle, epoch in itertools.product([False, True], range(3)):
        lay = layout(4, shuffle=shuffle)
        got = [Counter() for _ in sources]
        batches = []
        for rank in range(ranks):
            mix = mixture.epoch(lay, epoch, ())
            spans = mixture.spans(mix, Topology(rank, ranks, 0, workers))
            counts, _ = Mixed(mixture, lay).rank_streams(
                Pass(epoch), Topology(rank, ranks, 0, workers)
            )
            assert counts == [lay.batches(b - a) for a, b in spans]
            batches.append(sum(counts))
            for a, b in spans:
                for i, c in enumerate(stream_rows(mix, a, b)):
                    got[i].update(c)
        assert len(set(batches)) == 1  # every rank the same batches
        kept = sum(q) // ranks * ranks  # "drop": the remainder rows are left out
        assert sum(sum(c.values()) for c in got) == kept
        for i, chunk_rows in enumerate(sources):
            passes = -(-(epoch + 1) * q[i] // rows[i]) if rows[i] else 0
            seq = pass_sequence(chunk_rows, i, passes, shuffle)
            expected = Counter(seq[epoch * q[i] : (epoch + 1) * q[i]])
            assert not (got[i] - expected), "a row no stream should read"
        if kept == sum(q):
            for i, chunk_rows in enumerate(sources):
                passes = -(-(epoch + 1) * q[i] // rows[i]) if rows[i] else 0
                seq = pass_sequence(chunk_rows, i, passes, shuffle)
                assert got[i] == Counter(seq[epoch * q[i] : (epoch + 1) * q[i]])


def test_every_row_once_before_any_row_twice() -> None:
    chunk_rows = [3, 4, 2]
    mixture = Mixture((np.asarray(chunk_rows), np.asarray([5])), (7, 2), "random")
    lay = layout(3, shuffle=True)
    seen: Counter = Counter()
    for epoch in range(6):
        mix = mixture.epoch(lay, epoch, ())
        ((a, b),) = mixture.spans(mix, Topology(0, 1, 0, 1))
        seen.update(stream_rows(mix, a, b)[0])
        total = (epoch + 1) * 7
        low, extra = divmod(total, sum(chunk_rows))
        counts = sorted(seen.values())
        assert len(seen) == sum(chunk_rows) or total < sum(chunk_rows)
        assert counts.count(low + 1) == extra or low == 0
        assert set(counts) <= {low, low + 1}


@pytest.mark.parametrize("seed", range(8))
def test_a_resumed_pass_starts_each_source_where_its_delivered_positions_stopped(seed: int) -> None:
    rng = random.Random(seed)
    mixture = Mixture((np.asarray([7, 5, 9]), np.asarray([4, 4])), (15, 8), "random")
    lay = layout(4, shuffle=True)
    workers = rng.randint(1, 3)
    rank = Topology(0, 1, 0, workers)
    counts, _ = Mixed(mixture, lay).rank_streams(Pass(1), rank)
    delivered = rng.randint(0, sum(counts))
    done = consumed(counts, delivered)
    for w in range(workers):
        resumed = Pass(1, (), delivered)
        stream = Mixed(mixture, lay).resolve(resumed, Topology(0, 1, w, workers))
        assert stream.done == done[w]
        assert stream.start == min(done[w] * 4, stream.length)


def simulate_leg(mixture: Mixture, lay: Layout, epoch: int, legs: tuple[Leg, ...], leg: Leg):
    """Rows (per source) the old leg's streams deliver before it stops, read through the real
    block order: each source's part of a stream in blocks, each block permuted as the reader
    does (`block_permutation` keyed by source)."""
    from torch_dataloader_utils.planning import block_bounds, block_permutation

    mix = mixture.epoch(leg.layout, epoch, legs)
    delivered = [Counter() for _ in mixture.quotas]
    for rank in range(leg.world_size):
        top = Topology(rank, leg.world_size, 0, leg.num_workers)
        spans = mixture.spans(mix, top)
        done = consumed([leg.layout.batches(b - a) for a, b in spans], leg.batches)
        for w, (a, b) in enumerate(spans):
            read = min(done[w] * leg.layout.batch_size, b - a)
            took = (mix.current.prefix(a + read) - mix.current.prefix(a)).tolist()
            for i in range(len(mixture.quotas)):
                epoch_i = mix.source_epoch(i)
                rows = []
                for run in mix.source_runs(a, b)[i]:
                    pieces, select = epoch_i.run_pieces(run)
                    flat = [(p.chunk, r) for p in pieces for r in range(p.start, p.stop)]
                    rows += flat if select is None else [flat[s] for s in select]
                src_layout = epoch_i.layout
                order = []
                for index, (x, y) in enumerate(
                    block_bounds(
                        len(rows),
                        block_rows=src_layout.block_rows,
                        first_block_rows=src_layout.first_block_rows,
                    )
                ):
                    perm = block_permutation(
                        seed=leg.layout.seed,
                        epoch=epoch,
                        stream=top.num_workers * rank + w,
                        block=index,
                        n=y - x,
                        leg=len(legs),
                        source=i,
                    )
                    order += [rows[x + p] for p in perm]
                delivered[i].update(order[: took[i]])
    return delivered


@pytest.mark.parametrize("seed", range(30))
def test_elastic_legs_read_the_rest_of_each_source_once(seed: int) -> None:
    rng = random.Random(seed)
    mixture = Mixture(
        (
            np.asarray([rng.randint(1, 9) for _ in range(5)]),
            np.asarray([rng.randint(1, 9) for _ in range(3)]),
        ),
        (rng.randint(20, 40), rng.randint(5, 20)),
        rng.choice(["random", "stratified"]),
    )
    epoch = rng.randint(0, 2)
    lay = layout(3, shuffle=True, remainder="uneven")  # every row kept, whatever the ranks
    fresh = mixture.epoch(lay, epoch, ())
    everything = [Counter() for _ in mixture.quotas]
    ((a, b),) = mixture.spans(fresh, Topology(0, 1, 0, 1))
    for i, c in enumerate(stream_rows(fresh, a, b)):
        everything[i].update(c)
    legs: tuple[Leg, ...] = ()
    got = [Counter() for _ in mixture.quotas]
    for _ in range(rng.randint(1, 2)):
        ranks, workers = rng.randint(1, 3), rng.randint(1, 3)
        per_rank = [
            sum(
                Mixed(mixture, lay).rank_streams(Pass(epoch, legs), Topology(r, ranks, 0, workers))[
                    0
                ]
            )
            for r in range(ranks)
        ]
        batches = rng.randint(0, min(per_rank))
        leg = Leg(ranks, workers, lay, batches)
        for i, c in enumerate(simulate_leg(mixture, lay, epoch, legs, leg)):
            got[i].update(c)
        legs = (*legs, leg)
    # The last topology reads what is left, to the end.
    mix = mixture.epoch(lay, epoch, legs)
    ranks, workers = rng.randint(1, 4), rng.randint(1, 3)
    for rank in range(ranks):
        for a, b in mixture.spans(mix, Topology(rank, ranks, 0, workers)):
            for i, c in enumerate(stream_rows(mix, a, b)):
                got[i].update(c)
    assert got == everything


def test_an_empty_interleave_has_no_positions() -> None:
    inter = Interleave([0, 0], "random", seed=0, epoch=0)
    assert inter.labels(0, 5).tolist() == [] and inter.prefix(7).tolist() == [0, 0]


@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_packed_mixtures_streams_start_at_whole_sequences(
    remainder: str, drop_last: bool
) -> None:
    """A packed mixture gives each sequence (``seq_tokens`` positions) to one source: a rank or
    worker starting inside a sequence would read half of another source's sequence (it failed
    with 4 ranks over 162 sequences). Spans are cut in sequences; ranks stay equal."""
    seq_tokens, sequences = 8, 162
    base = layout(3 * seq_tokens, shuffle=True, drop_last=drop_last, remainder=remainder)
    lay = dataclasses.replace(base, seq_tokens=seq_tokens)
    mixture = Mixture(
        (np.asarray([100, 60]), np.asarray([40])), (106 * seq_tokens, 56 * seq_tokens), "random"
    )
    assert sum(mixture.quotas) == sequences * seq_tokens
    for ranks, workers in itertools.product([1, 2, 3, 4, 5, 7], [1, 2, 3]):
        mix = mixture.epoch(lay, 0, ())
        every: list[tuple[int, int]] = []
        batches = []
        for rank in range(ranks):
            spans = mixture.spans(mix, Topology(rank, ranks, 0, workers))
            assert all(a % seq_tokens == 0 and b % seq_tokens == 0 for a, b in spans)
            counts, _ = Mixed(mixture, lay).rank_streams(Pass(0), Topology(rank, ranks, 0, workers))
            assert sum(counts) == Mixed(mixture, lay).rank_batches(Topology(rank, ranks))
            batches.append(sum(counts))
            every += spans
        if remainder != "uneven":
            assert len(set(batches)) == 1
        covered = sum(b - a for a, b in every)
        if remainder == "drop" and not drop_last:
            assert (
                covered == sequences // ranks * ranks * seq_tokens
            )  # fewer than a sequence a rank
