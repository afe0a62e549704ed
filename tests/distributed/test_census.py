"""The census under torchrun (gloo, CPU): each rank tokenizes its share of the chunks at
planning, every token is read once across ranks and workers, and a restarted job on fresh
``cache_dir``s with the same ``census_dir`` tokenizes nothing at planning."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.distributed.conftest import run_script
from tests.text_data import oracle, where_of, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_each_rank_counts_a_share_and_a_restart_counts_nothing(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "data", files=4, per_file=40)
    where = where_of(oracle(corpus))
    texts = sum(t is not None for t in corpus.texts.values())
    shared = str(tmp_path / "census")
    corpus.tokenizer.save(str(tmp_path / "tokenizer.json"))
    cases = [
        {"name": "first", "cache_dir": str(tmp_path / "a"), "census_dir": shared},
        {"name": "restart", "cache_dir": str(tmp_path / "b"), "census_dir": shared},
    ]
    spec = {
        "out": str(tmp_path / "out.json"),
        "data": str(corpus.root),
        "tokenizer": str(tmp_path / "tokenizer.json"),
        "cases": cases,
    }
    result, _ = run_script("census.py", 2, spec)
    first, restart = result["first"], result["restart"]
    assert sum(r["planned"] for r in first) == texts  # every text once, over the ranks ...
    assert all(r["planned"] for r in first)  # ... a share on each
    assert [r["planned"] for r in restart] == [0, 0]  # the census kept: nothing tokenized
    assert len({r["fingerprint"] for r in first + restart}) == 1
    for name, ranks in result.items():
        assert len({len(r["tokens"]) for r in ranks}) == 1, name  # equal batches
        seen = Counter(t for r in ranks for batch in r["tokens"] for t in batch)
        assert set(seen) == set(where), name  # every token ...
        assert sum(seen.values()) - len(where) < 2 * 3 * 8, name  # ... once ("pad": a batch)
