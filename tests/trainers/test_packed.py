"""Packed sequences in the trainers' loaders: ``examples/train_packed.py`` (a tiny causal LM,
stopped mid-epoch and resumed on another number of workers) and torchdata's
``StatefulDataLoader(dataset, batch_size=None)``, every token once."""

from __future__ import annotations

from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import torch_dataloader_utils as tdu
from tests.trainers.conftest import run_example

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]


def test_the_example_trains_resumes_and_reads_every_token_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temporary = tmp_path / "tmp"  # the example's temporary folders go here, and must go
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    # torch keeps its compiler's cache in the temporary folder: not the example's to remove
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    output = run_example("train_packed.py", "--seq-len", "128")
    assert "every token exactly once: yes" in output
    assert sorted(p.name for p in temporary.iterdir()) == []


def test_torchdatas_stateful_loader_resumes_a_packed_epoch_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    token = 0
    for part in range(3):
        documents = []
        for _ in range(30):
            n = int(rng.integers(1, 60))
            documents.append(list(range(token, token + n)))
            token += n
        table = pa.table({"tokens": pa.array(documents, pa.list_(pa.int64()))})
        pq.write_table(table, tmp_path / f"part-{part}.parquet", row_group_size=8)

    def loader() -> StatefulDataLoader:
        dataset = tdu.StructuredDataset(
            str(tmp_path),
            packing=tdu.Packing("tokens", seq_len=16, pad_value=-1),
            batch_size=2,
            shuffle=True,
        )
        return StatefulDataLoader(
            dataset, batch_size=None, num_workers=2, multiprocessing_context="fork"
        )

    seen: Counter[int] = Counter()
    first = loader()
    for batch in islice(first, 7):
        ids = batch["input_ids"]
        seen.update(ids[ids >= 0].tolist())
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    for batch in second:
        ids = batch["input_ids"]
        seen.update(ids[ids >= 0].tolist())
    assert seen == Counter(range(token))
