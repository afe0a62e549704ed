"""What goes wrong with text tokenized in the loader is named: a tokenizer or transform that
gives a chunk another count than the census is a `DataError` naming the file, the chunk and both
counts, never a silent shift. Each case runs in its own process with a timeout, so a crash or a
hang fails the test instead of the suite."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.text_data import write_corpus

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]

# The tokenizer and transform change what they give between planning (the census) and reading:
# the script sets TDU_TEST_PHASE to "read" after the loader is made (workers fork after it).
SCRIPT = """
import json, os, sys
import pyarrow as pa
import torch_dataloader_utils as tdu
from tests.text_data import titled, word_tokenizer

spec = json.loads(sys.argv[1])
words = word_tokenizer([])

def tokens(texts):
    extra = [7] if os.environ.get("TDU_TEST_PHASE") == "read" else []
    return [[3] * len(t.split()) + extra for t in texts]

def dropping(batch):
    out = titled(batch)
    return out.slice(1) if os.environ.get("TDU_TEST_PHASE") == "read" else out

os.environ["TDU_TEST_PHASE"] = "census"
options = dict(
    tokenize=tdu.Tokenize("text", tokens, fingerprint="counts"),
    packing=tdu.Packing("tokens", 8, pad_value=-1),
    batch_size=3, null_policy="fill", num_workers=spec["workers"],
)
if spec["case"] == "transform":
    options["transform"] = tdu.Transform(dropping, fingerprint="drops")
    options["tokenize"] = tdu.Tokenize("text", tokens, fingerprint="same")
    options["packing"] = None
    options["batch_size"] = 4
    options["output_format"] = "arrow"
loader = tdu.create_dataloader(spec["root"], **options)
os.environ["TDU_TEST_PHASE"] = "read"
try:
    for _ in loader:
        pass
except Exception as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"type": None}))
"""


def run(root: Path, case: str, workers: int) -> dict[str, str]:
    spec = json.dumps({"root": str(root), "case": case, "workers": workers})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), spec],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("errors")).root


@pytest.mark.parametrize("workers", [0, 2])
def test_a_tokenizer_that_counts_otherwise_than_the_census_is_named(
    root: Path, workers: int
) -> None:
    error = run(root, "tokenizer", workers)
    assert error["type"] == "DataError", error
    message = error["message"]
    assert "part-" in message and ".parquet (chunk " in message, message
    assert "the tokenizer gave" in message and "the census counted" in message, message
    given, counted = (int(re.search(p + r"(\d+)", message)[1]) for p in ("gave ", "counted "))
    assert given > counted  # (one more token a text, read)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_that_yields_other_rows_than_the_census_is_named(
    root: Path, workers: int
) -> None:
    error = run(root, "transform", workers)
    assert error["type"] == "DataError", error
    message = error["message"]
    assert "part-" in message and ".parquet (chunk " in message, message
    assert "the transform 'drops' yielded" in message and "the census counted" in message
    given, counted = (int(re.search(p + r"(\d+)", message)[1]) for p in ("yielded ", "counted "))
    assert given == counted - 1
