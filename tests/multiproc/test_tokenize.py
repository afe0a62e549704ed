"""Raw text tokenized in the loader, read for real: Parquet text, a real `tokenizers`
tokenizer, DataLoader workers (fork and spawn), several ranks, two epochs, exact and elastic
resume, a transform that drops rows (a whole chunk's too), token budgets and plain token lists.
Everything is checked against the one-process oracle (`tests.text_data.oracle`): every token
once (ids are unique in the corpus), each in its document and place."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.packed_data import tokens_of, write_documents
from tests.text_data import EOS, Corpus, all_tokens, oracle, titled, where_of, write_corpus

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH, PAD = 8, 3, -1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """3 files of 40 rows (row groups of 7): empty, null and multi-byte texts, one text of 10x
    ``SEQ_LEN`` words a file, and a row group whose every row the transform drops."""
    return write_corpus(
        tmp_path_factory.mktemp("text"), long_words=10 * SEQ_LEN, dropped_group=(1, 2)
    )


def tokenize(corpus: Corpus, **given: Any) -> tdu.Tokenize:
    return tdu.Tokenize("text", corpus.tokenizer, **given)


def packed(
    corpus: Corpus,
    *,
    transform: bool = False,
    method: str = "concat",
    eos: int | None = None,
    **options: Any,
) -> Any:
    options = {"shuffle": True, "num_workers": 0, "null_policy": "fill", **options}
    if transform:
        options["transform"] = tdu.Transform(titled, fingerprint="titled-v1")
    return tdu.create_dataloader(
        str(corpus.root),
        columns=None,
        tokenize=tokenize(corpus, eos_token=eos),
        packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD, method=method, fill=0.8),
        batch_size=BATCH,
        **options,
    )


TOPOLOGIES = [  # world size, workers, method, transform, multiprocessing context
    (1, 0, "concat", False, None),
    (2, 2, "concat", True, None),
    (3, 0, "best_fit", False, None),
    (2, 2, "best_fit", True, None),
    (1, 2, "concat", True, "spawn"),
]


@pytest.mark.parametrize(("world_size", "workers", "method", "transform", "context"), TOPOLOGIES)
def test_every_token_once_on_every_topology_with_equal_batches(
    corpus: Corpus,
    world_size: int,
    workers: int,
    method: str,
    transform: bool,
    context: str | None,
) -> None:
    tokens = oracle(corpus, transform=transform)
    where = where_of(tokens)
    extra = {} if context is None else {"multiprocessing_context": context}
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        counts = []
        for rank in range(world_size):
            loader = packed(
                corpus,
                transform=transform,
                method=method,
                rank=rank,
                world_size=world_size,
                num_workers=workers,
                remainder="pad",
                **extra,
            )
            known = len(loader)  # (before the epoch is read)
            loader.set_epoch(epoch)
            n = 0
            for batch in loader:
                seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
                n += 1
            assert n == known
            counts.append(n)
        assert len(set(counts)) == 1  # equal batches on every rank
        assert set(seen) == set(where)  # every token, in its document and place
        repeated = sum(seen.values()) - len(where)  # ("pad" wraps at most a batch a rank)
        assert repeated < world_size * BATCH * SEQ_LEN
        if world_size == 1:
            assert repeated == 0


@pytest.mark.parametrize("where_eos", ["tokenize", "packing"])
def test_an_eos_token_ends_every_text_that_is_not_null(corpus: Corpus, where_eos: str) -> None:
    """`Tokenize.eos_token` is in the tokens the census counts; `Packing.eos_token` is one
    more per document the census counts: both read every token and one EOS a text."""
    tokens = oracle(corpus, eos=True)
    given = {"tokenize": {"eos_token": EOS}, "packing": {"eos_token": EOS}}[where_eos]
    tok = tokenize(corpus, **given) if where_eos == "tokenize" else tokenize(corpus)
    packing = tdu.Packing(
        "tokens", SEQ_LEN, pad_value=PAD, **(given if where_eos == "packing" else {})
    )
    loader = tdu.create_dataloader(
        str(corpus.root),
        columns=["text"],
        tokenize=tok,
        packing=packing,
        batch_size=BATCH,
        num_workers=2,
        shuffle=True,
        null_policy="fill",
    )
    seen = Counter(t for b in loader for t in b["input_ids"].reshape(-1).tolist() if t != PAD)
    assert seen == Counter(all_tokens(tokens))
    assert seen[EOS] == sum(t is not None for t in corpus.texts.values())
    assert len(loader) > len(packed(corpus))


RESUMES = [((1, 2), (1, 2)), ((2, 2), (2, 2)), ((2, 2), (3, 0)), ((1, 0), (2, 2))]


@pytest.mark.parametrize(("before", "after"), RESUMES)
@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_a_resumed_epoch_reads_every_remaining_token_once(
    corpus: Corpus, before: tuple[int, int], after: tuple[int, int], method: str
) -> None:
    where = where_of(oracle(corpus, transform=True))
    (ranks, workers), (new_ranks, new_workers) = before, after
    seen: Counter[int] = Counter()
    state = None
    kept = {"transform": True, "method": method, "remainder": "pad"}
    for rank in range(ranks):
        loader = packed(corpus, rank=rank, world_size=ranks, num_workers=workers, **kept)
        loader.set_epoch(1)
        for batch in itertools.islice(loader, 4):
            seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
        if rank == 0:
            state = loader.state_dict()
    assert state is not None
    assert {"tokenizer", "transform"} <= set(state["plan"])  # (named by their fingerprints)
    for rank in range(new_ranks):
        loader = packed(corpus, rank=rank, world_size=new_ranks, num_workers=new_workers, **kept)
        loader.load_state_dict(state)
        for batch in loader:
            seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
    assert set(seen) == set(where)
    repeated = sum(seen.values()) - len(where)
    assert repeated < (ranks + new_ranks) * BATCH * SEQ_LEN
    if before == after:
        assert repeated < ranks * BATCH * SEQ_LEN


def test_a_state_saved_with_another_tokenizer_or_transform_is_refused_naming_it(
    corpus: Corpus,
) -> None:
    loader = packed(corpus, transform=True)
    for _ in itertools.islice(loader, 2):
        pass
    state = loader.state_dict()
    other = tdu.Tokenize(
        "text", lambda texts: [[2] * len(t.split()) for t in texts], fingerprint="other"
    )
    cases = [("tokenizer", other, "titled-v1"), ("transform", tokenize(corpus), "titled-v2")]
    for changed, tok, version in cases:
        loader = tdu.create_dataloader(
            str(corpus.root),
            tokenize=tok,
            transform=tdu.Transform(titled, fingerprint=version),
            packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD),
            batch_size=BATCH,
            shuffle=True,
            num_workers=0,
        )
        with pytest.raises(tdu.StateMismatchError, match=f"another {changed}") as error:
            loader.load_state_dict(state)
        kept = "transform" if changed == "tokenizer" else "tokenizer"
        assert f"another {kept}" not in str(error.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_token_budget_reads_every_kept_row_once_with_its_tokens(
    corpus: Corpus, workers: int
) -> None:
    tokens = oracle(corpus, transform=True)
    for rank_count in (1, 2):
        seen: Counter[int] = Counter()
        counts = []
        for rank in range(rank_count):
            loader = tdu.create_dataloader(
                str(corpus.root),
                tokenize=tokenize(corpus),
                transform=tdu.Transform(titled, fingerprint="titled-v1"),
                batching=tdu.TokenBudget("tokens", max_tokens=12 * SEQ_LEN),
                output_format="arrow",
                shuffle=True,
                rank=rank,
                world_size=rank_count,
                remainder="pad",
                num_workers=workers,
            )
            n = 0
            for batch in loader:
                for i, ids in zip(
                    batch["id"].to_pylist(), batch["tokens"].to_pylist(), strict=True
                ):
                    assert ids == tokens[i] or (ids == [] and tokens[i] is None), i
                    seen[i] += 1
                n += 1
            counts.append(n)
        assert len(set(counts)) == 1
        assert set(seen) == set(tokens)  # every row the transform keeps, none it drops
        assert sum(seen.values()) - len(tokens) < 3 * rank_count  # ("pad" repeats a few)


def test_without_packing_each_row_carries_its_token_list(corpus: Corpus) -> None:
    tokens = oracle(corpus)
    loader = tdu.create_dataloader(
        str(corpus.root),
        columns=["id", "text"],
        tokenize=tokenize(corpus, output="ids"),
        output_format="arrow",
        batch_size=16,
        shuffle=True,
        num_workers=2,
    )
    seen = Counter()
    for batch in loader:
        assert batch.schema.names == ["id", "text", "ids"]
        for i, text, ids in zip(
            batch["id"].to_pylist(),
            batch["text"].to_pylist(),
            batch["ids"].to_pylist(),
            strict=True,
        ):
            assert text == corpus.texts[i] and ids == tokens[i]
            seen[i] += 1
    assert seen == Counter(list(corpus.texts))


@pytest.mark.parametrize("transform", [False, True])
def test_rows_at_names_each_pieces_file_row_and_tokens(corpus: Corpus, transform: bool) -> None:
    """Each piece's file, row (the row in the file; none for the rows a transform yields) and
    token range, from the plan, are the batch's tokens."""
    tokens = oracle(corpus, transform=transform)
    where = where_of(tokens)
    loader = packed(corpus, transform=transform, num_workers=2)
    loader.set_epoch(1)
    for b, batch in enumerate(loader):
        table = loader.rows_at(b, epoch=1, columns=["id"])
        looked: list[int] = []
        for row_id, start, n, file, row in zip(
            table.column("id").to_pylist(),
            table.column("__fragment_start__").to_pylist(),
            table.column("__fragment_tokens__").to_pylist(),
            table.column("__file__").to_pylist(),
            table.column("__row__").to_pylist(),
            strict=True,
        ):
            looked += (tokens[row_id] or [])[start : start + n]
            number = int(file.rsplit("part-", 1)[1].split(".")[0])
            assert row == (None if transform else row_id - 40 * number)  # (40 rows a file)
        got = tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH)
        assert looked == got, b


def test_skip_leaves_out_the_batches_named(corpus: Corpus) -> None:
    whole = [b["input_ids"].tolist() for b in packed(corpus, num_workers=2)]
    loader = packed(corpus, num_workers=2)
    loader.skip(0, range(2, 5))
    rest = [b["input_ids"].tolist() for b in loader]
    assert rest == whole[:2] + whole[5:]
    assert len(loader) == len(whole) - 3


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """Another corpus, with its own tokenizer (its ids overlap the first's)."""
    return write_corpus(tmp_path_factory.mktemp("second"), seed=11)


def mixed(corpus: Corpus, second: Corpus, **options: Any) -> Any:
    sources = [
        tdu.Source(str(corpus.root), tokenize=tokenize(corpus)),
        tdu.Source(str(second.root), tokenize=tokenize(second)),
    ]
    return tdu.create_dataloader(
        sources,
        packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD),
        batch_size=BATCH,
        epoch_rows=1200,  # (tokens: fewer than either source holds)
        weights_schedule=[(0, [1, 1]), (10, [1, 3])],
        source_column="source",
        shuffle=True,
        null_policy="fill",
        remainder="pad",
        **options,
    )


def test_a_mixture_tokenizes_each_source_with_its_own_tokenizer(
    corpus: Corpus, second: Corpus
) -> None:
    wheres = [where_of(oracle(corpus)), where_of(oracle(second))]
    counts = []
    seen: list[Counter[int]] = [Counter(), Counter()]
    for rank in range(2):
        loader = mixed(corpus, second, rank=rank, world_size=2, num_workers=2)
        n = 0
        for batch in loader:
            sources = batch["source"].tolist()
            for row, ids in zip(sources, batch["input_ids"].tolist(), strict=True):
                (s,) = {x for x, t in zip(row, ids, strict=True) if t != PAD} or {0}
                seen[s].update(t for t in ids if t != PAD)
            n += 1
        counts.append(n)
    assert len(set(counts)) == 1
    for s in (0, 1):
        assert set(seen[s]) <= set(wheres[s])  # (each source's tokens, by its own tokenizer)
        assert max(seen[s].values()) == 1  # none twice: the quotas are under each's tokens
    assert sum(seen[1].values()) > sum(seen[0].values())  # (weights 1:1, then 1:3)


def test_a_mixture_state_with_another_tokenizer_of_a_source_is_refused(
    corpus: Corpus, second: Corpus
) -> None:
    loader = mixed(corpus, second, num_workers=0)
    for _ in itertools.islice(loader, 2):
        pass
    state = loader.state_dict()
    other = tdu.Tokenize("text", lambda texts: [[2] for _ in texts], fingerprint="one-token")
    changed = tdu.create_dataloader(
        [
            tdu.Source(str(corpus.root), tokenize=tokenize(corpus)),
            tdu.Source(str(second.root), tokenize=other),
        ],
        packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD),
        batch_size=BATCH,
        epoch_rows=1200,
        weights_schedule=[(0, [1, 1]), (10, [1, 3])],
        source_column="source",
        shuffle=True,
        null_policy="fill",
        remainder="pad",
        num_workers=0,
    )
    with pytest.raises(tdu.StateMismatchError, match="another tokenizer"):
        changed.load_state_dict(state)


def test_a_transform_alone_filters_token_lists_counted_by_the_census(tmp_path: Path) -> None:
    """A pre-tokenized source with a transform (no tokenizer): the census counts the token
    column the transform leaves; every token of the rows it keeps, once."""
    where = write_documents(tmp_path, files=2, per_file=30)
    table = pq.read_table(tmp_path)
    kept = {
        t
        for i, doc in zip(table["id"].to_pylist(), table["tokens"].to_pylist(), strict=True)
        if i % 3 and doc
        for t in doc
    }
    transform = tdu.Transform(lambda b: b.filter(pc.not_equal(pc.modulo(b["id"], 3), 0)), "mod3")
    loader = tdu.create_dataloader(
        str(tmp_path),
        transform=transform,
        packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD),
        batch_size=BATCH,
        null_policy="fill",
        shuffle=True,
        num_workers=2,
    )
    seen: Counter[int] = Counter()
    for batch in loader:
        seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
    assert seen == Counter(kept)
