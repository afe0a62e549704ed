"""Fuzzing our own parsers with mutated real files: the outcome is always the reference's rows
or a clear library error naming the file, never a crash, a hang or other rows.

The parsers are those the library wrote itself, where pyarrow does not parse for it: the
Parquet footer walk (`formats.parquet.footer`), the ORC tail (`formats.orc.parse_stripes`),
the IPC message headers (`formats.ipc.messages`, file and stream), the tar header walk
(`webdataset.tar`), the CSV record scan (`formats.text.format`'s quote parity) and the DALI-style
shard index (`webdataset.index`). Hypothesis mutates a real file of the corpus in the region
the parser reads (overwritten bytes, a cut), writes it to a temporary directory, and the
corpus runner reads it in its child process with 0 workers (shuffled, Arrow output) and with
the reference reader.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.corpus.cases import ROOT, Case
from tests.corpus.pool import Runner

# Seed files per parser: the corpus path, the format, and where the parser reads: "tail"
# (footers), "head" (headers), "all" (anywhere).
SEEDS: dict[str, tuple[str, str, str]] = {
    "parquet-footer": ("parquet-testing/data/alltypes_plain.parquet", "parquet", "tail"),
    "parquet-footer-nested": (
        "parquet-testing/data/nested_lists.snappy.parquet",
        "parquet",
        "tail",
    ),
    "orc-tail": ("orc/examples/TestOrcFile.test1.orc", "orc", "tail"),
    "ipc-file-layout": (
        "arrow-testing/data/arrow-ipc-stream/integration/cpp-21.0.0/generated_primitive.arrow_file",
        "ipc",
        "all",
    ),
    "ipc-stream-layout": (
        "arrow-testing/data/arrow-ipc-stream/integration/cpp-21.0.0/generated_primitive.stream",
        "ipc",
        "all",
    ),
    "tar-headers": ("webdataset/testdata/tendata.tar", "webdataset", "all"),
    "csv-quote-scan": ("csv-spectrum/csvs/quotes_and_newlines.csv", "csv", "all"),
    "csv-records": ("arrow-testing/data/csv/aggregate_test_100.csv", "csv", "all"),
}
# Bytes a "tail" or "head" mutation stays within.
_REGION = 2048
# Bytes that matter to the parsers: quotes, newlines, delimiters, zeros, high bits.
_INTERESTING = [0x00, 0x0A, 0x0D, 0x22, 0x2C, 0x30, 0x7F, 0x80, 0xFF]

EXAMPLES = 25


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    found = Runner()
    yield found
    found.close()


@st.composite
def mutations(draw: st.DrawFn, size: int, region: str) -> tuple[list[tuple[int, int]], int]:
    """Up to 4 overwritten bytes (position, value) in the region the parser reads, and the
    length the file is cut to (``size``: not cut)."""
    lo, hi = {
        "tail": (max(0, size - _REGION), size),
        "head": (0, min(size, _REGION)),
        "all": (0, size),
    }[region]
    edits = draw(
        st.lists(
            st.tuples(
                st.integers(lo, hi - 1),
                st.one_of(st.sampled_from(_INTERESTING), st.integers(0, 255)),
            ),
            min_size=0,
            max_size=4,
        )
    )
    cut = draw(st.one_of(st.just(size), st.integers(lo, size)))
    if not edits and cut == size:
        edits = [(hi - 1, draw(st.integers(0, 255)))]
    return edits, cut


def _mutated(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    out = bytearray(data)
    for position, value in edits:
        out[position] = value
    return bytes(out[:cut])


def _check(runner: Runner, case: Case) -> None:
    config = {"workers": 0, "output": "arrow", "shuffle": True, "batch_size": 13}
    verdict: dict[str, Any] = runner.run(
        {"case": dataclasses.asdict(case), "config": config}, timeout=60
    )
    # A clear error is fine whatever the reference did; rows must be the reference's.
    assert verdict["verdict"] in ("match", "refused"), verdict


@pytest.mark.parametrize("parser", sorted(SEEDS))
def test_mutated_files_read_as_the_reference_or_fail_clearly(
    parser: str, runner: Runner, tmp_path_factory: pytest.TempPathFactory
) -> None:
    relpath, fmt, region = SEEDS[parser]
    seed = ROOT / relpath
    data = seed.read_bytes()
    work = tmp_path_factory.mktemp(parser)
    options = {"missing_component": "empty", "decode": False} if fmt == "webdataset" else {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(mutation=mutations(len(data), region))
    def check(mutation: tuple[list[tuple[int, int]], int]) -> None:
        target = work / seed.name
        target.write_bytes(_mutated(data, *mutation))
        _check(runner, Case(str(target), fmt, options, ipc_kind=_ipc_kind(relpath)))

    check()


def _ipc_kind(relpath: str) -> str:
    return "file" if relpath.endswith(".arrow_file") else "stream"


def test_mutated_dali_index_reads_as_the_shard_or_fails_clearly(
    runner: Runner, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A shard's sibling ``.idx`` (DALI's index format) mutated: the library reads the shard
    as the reference does, or refuses the index clearly; never rows the shard does not hold."""
    from torch_dataloader_utils.webdataset.index import build_index, format_index, index_path

    shard = ROOT / "webdataset/testdata/tendata.tar"
    work = tmp_path_factory.mktemp("dali")
    target = work / shard.name
    shutil.copyfile(shard, target)
    data = target.read_bytes()
    index = build_index(lambda offset, n: data[offset : offset + n], len(data), where=str(target))
    text = format_index(index).encode()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(mutation=mutations(len(text), "all"))
    def check(mutation: tuple[list[tuple[int, int]], int]) -> None:
        Path(index_path(str(target))).write_bytes(_mutated(text, *mutation))
        options = {"missing_component": "empty", "decode": False, "index_cache_dir": ""}
        _check(runner, Case(str(target), "webdataset", options))

    check()
