"""A tokenizer used before the DataLoader forks its workers (trained in the same process, as
examples do) neither warns nor deadlocks in them: the loader turns the tokenizer's own thread
pool off when a `Tokenize` is made, unless the user chose. Run in a fresh process each (the
pool's state is per process), with a timeout, so a deadlock fails the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from collections import Counter
import pyarrow as pa, pyarrow.parquet as pq
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
import torch_dataloader_utils as tdu

root = sys.argv[1]
texts = [" ".join(f"w{i * 7 + k} é{k}" for k in range(i % 40)) for i in range(2000)]
pq.write_table(pa.table({"text": texts}), f"{root}/t.parquet", row_group_size=100)
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
alphabet = pre_tokenizers.ByteLevel.alphabet()
tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet))
expected = Counter(t for e in tok.encode_batch(texts) for t in e.ids)  # (the pool, used)
loader = tdu.create_dataloader(
    root, tokenize=tdu.Tokenize("text", tok), packing=tdu.Packing("tokens", 64, pad_value=-1),
    batch_size=4, num_workers=2, multiprocessing_context="fork", shuffle=True,
)
seen = Counter(t for b in loader for t in b["input_ids"].reshape(-1).tolist() if t >= 0)
print(json.dumps({"equal": seen == expected, "tokens": sum(seen.values())}))
"""


@pytest.mark.parametrize("given", [None, "true"])
def test_workers_forked_after_the_tokenizer_was_used_do_not_warn(
    tmp_path: Path, given: str | None
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    if given is not None:  # the user's own choice is kept (and then theirs to live with)
        env["TOKENIZERS_PARALLELISM"] = given
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["equal"] and result["tokens"] > 10_000, result
    assert "huggingface/tokenizers" not in done.stderr, done.stderr[-2000:]
