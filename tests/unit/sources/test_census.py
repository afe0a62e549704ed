"""The census: each chunk's counts as the one-process oracle says, taken once and kept in
``cache_dir`` and a shared ``census_dir``, so that another job tokenizes nothing at planning."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

import torch_dataloader_utils as tdu
from tests.text_data import Corpus, Counting, oracle, titled, write_corpus
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.sources.census import (
    CENSUS_FOLDER,
    ChunkCensus,
    KeptCensus,
    census_threads,
)
from torch_dataloader_utils.tokenizing import Derivation


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return write_corpus(tmp_path_factory.mktemp("census"), dropped_group=(0, 1))


def build(corpus: Corpus, tokenizer: Counting, **options: object) -> tdu.TabularDataLoader:
    return tdu.create_dataloader(
        str(corpus.root),
        tokenize=tdu.Tokenize("text", tokenizer, fingerprint="words-v1"),
        transform=tdu.Transform(titled, fingerprint="titled-v1"),
        batching=tdu.TokenBudget("tokens", max_tokens=64),
        output_format="arrow",
        num_workers=0,
        **options,  # type: ignore[arg-type]
    )


def test_the_counts_are_the_oracles(corpus: Corpus) -> None:
    loader = build(corpus, Counting(corpus))
    source = loader.dataset.sources[0]
    tokens = oracle(corpus, transform=True)
    assert source.plan.num_rows == len(tokens)  # (the rows the transform keeps)
    # (Plan order: files, rows; a null list's length -1, as the length index marks it.)
    lengths = [-1 if t is None else len(t) for t in tokens.values()]
    assert source.row_lengths is not None
    assert source.row_lengths.tolist() == lengths
    per_chunk = np.asarray(source.plan.chunk_rows)
    assert per_chunk[1] == 0  # (the row group the transform drops whole)
    assert per_chunk.sum() == len(tokens)


def test_a_second_job_with_the_census_dir_tokenizes_nothing_at_planning(
    corpus: Corpus, tmp_path: Path
) -> None:
    first = Counting(corpus)
    shared = tmp_path / "census"
    one = build(corpus, first, cache_dir=str(tmp_path / "a"), census_dir=str(shared))
    counted = first.texts
    kept = [i for i, keep in corpus.keep.items() if keep and corpus.texts[i] is not None]
    assert counted == len(kept)  # (each kept text once: no sample tokenized)
    for folder in (tmp_path / "a", shared):
        parts = list((folder / CENSUS_FOLDER).glob("*/part-*.arrow"))
        assert len(parts) == 1, folder
    second = Counting(corpus)  # another node: its own cache_dir, the shared census_dir
    two = build(corpus, second, cache_dir=str(tmp_path / "b"), census_dir=str(shared))
    assert second.texts == 0
    assert two.dataset.plan.fingerprint == one.dataset.plan.fingerprint
    assert [len(b) for b in two] == [len(b) for b in one]
    again = Counting(corpus)  # neither folder: counted again
    build(corpus, again)
    assert again.texts == counted


def test_kept_counts_are_keyed_by_the_tokenizer_and_transform(
    corpus: Corpus, tmp_path: Path
) -> None:
    kept = {"cache_dir": str(tmp_path / "cache")}
    build(corpus, Counting(corpus), **kept)
    other = Counting(corpus)
    tdu.create_dataloader(
        str(corpus.root),
        tokenize=tdu.Tokenize("text", other, fingerprint="words-v2"),
        transform=tdu.Transform(titled, fingerprint="titled-v1"),
        batching=tdu.TokenBudget("tokens", max_tokens=64),
        cache_dir=str(tmp_path / "cache"),
        num_workers=0,
    )
    assert other.texts > 0
    assert len(list((tmp_path / "cache" / CENSUS_FOLDER).iterdir())) == 2


def test_a_part_that_cannot_be_read_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    derive = Derivation(tdu.Transform(titled, "t"))
    local = FileSystemSpec("file")
    kept = KeptCensus([(local, str(tmp_path))], derive)
    counts = ChunkCensus(3, 10, 2, np.array([4, 6, 0], np.int32))
    kept.add({b"k" * 16: counts, b"j" * 16: ChunkCensus(0, 0, 0, None)})
    (folder,) = (tmp_path / CENSUS_FOLDER).iterdir()
    (folder / "part-broken.arrow").write_bytes(b"not arrow")
    with caplog.at_level(logging.WARNING):
        found = KeptCensus([(local, str(tmp_path))], derive).known()
    assert "part-broken.arrow cannot be read" in caplog.text
    assert found[b"j" * 16].lengths is None
    got = found[b"k" * 16]
    assert (got.rows, got.tokens, got.documents) == (3, 10, 2)
    assert got.lengths is not None and got.lengths.tolist() == [4, 6, 0]


def test_the_census_threads_share_the_nodes_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert census_threads() == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert census_threads() == 16


def test_a_rewritten_file_alone_is_counted_again(tmp_path: Path) -> None:
    """Counts are keyed by each file's identity: a file rewritten (a new modification time)
    has its chunks counted again, the others are read from the census."""
    corpus = write_corpus(tmp_path / "text", files=3)
    shared = str(tmp_path / "census")
    build(corpus, Counting(corpus), census_dir=shared)
    changed = corpus.root / "part-1.parquet"
    changed.write_bytes(changed.read_bytes())
    later = changed.stat().st_mtime + 10
    os.utime(changed, (later, later))
    again = Counting(corpus)
    build(corpus, again, census_dir=shared)
    in_file = [i for i in range(40, 80) if corpus.keep[i] and corpus.texts[i] is not None]
    assert again.texts == len(in_file)
