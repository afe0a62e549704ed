"""Text on object storage (SeaweedFS S3) tokenized in the loader, its census kept in a
``census_dir`` on the same store: a second job with no local cache tokenizes nothing at
planning, and reads every token once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import torch_dataloader_utils as tdu
from tests.services.seaweedfs import SeaweedFS
from tests.text_data import Counting, oracle, where_of, write_corpus
from torch_dataloader_utils.sources.census import CENSUS_FOLDER

from .conftest import BUCKET

pytestmark = pytest.mark.remote


def test_a_census_dir_on_object_storage_is_shared_by_jobs(
    seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    corpus = write_corpus(tmp_path / "text")
    store = seaweedfs.filesystem()
    seaweedfs.create_bucket(BUCKET)
    for path in sorted(corpus.root.iterdir()):
        store.put_file(str(path), f"{BUCKET}/text/{path.name}")
    store.invalidate_cache()
    where = where_of(oracle(corpus))

    def job(tokenizer: Counting) -> tuple[Any, int]:
        loader = tdu.create_dataloader(
            f"s3://{BUCKET}/text",
            storage_options=seaweedfs.s3fs_options(),
            tokenize=tdu.Tokenize("text", tokenizer, fingerprint="words-v1"),
            packing=tdu.Packing("tokens", 8, pad_value=-1),
            batch_size=3,
            shuffle=True,
            null_policy="fill",
            num_workers=0,
            census_dir=f"s3://{BUCKET}/census",
        )
        return loader, tokenizer.texts

    first, counted = job(Counting(corpus))
    assert counted == sum(t is not None for t in corpus.texts.values())
    store.invalidate_cache()
    parts = store.glob(f"{BUCKET}/census/{CENSUS_FOLDER}/*/part-*.arrow")
    assert len(parts) == 1, parts
    second, again = job(Counting(corpus))  # (no cache_dir: another node)
    assert again == 0
    assert second.dataset.plan.fingerprint == first.dataset.plan.fingerprint
    seen = Counter(t for b in second for t in b["input_ids"].reshape(-1).tolist() if t >= 0)
    assert seen == Counter(set(where))
