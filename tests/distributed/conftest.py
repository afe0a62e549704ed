"""Launching real ranks: torchrun with the gloo backend on CPU, and the data they read.

A test runs a script under ``python -m torch.distributed.run --standalone`` and reads the JSON
file rank 0 writes (`torchrun`, `read_result`). Scripts live in ``scripts/``; they join the
group, read, gather every rank's result with ``all_gather_object``, and rank 0 writes it. A
launch that fails or hangs fails the test with its output; nothing here is ever skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_table, write_parquet
from tests.packed_data import write_documents

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

# 839 rows in five files (one empty), with row groups of different sizes per file: 839 leaves
# a remainder of 1 row for 2 ranks and 2 rows for 3 ranks.
SIZES = (251, 401, 0, 150, 37)
ROW_GROUPS = (64, 100, 10, 50, 16)
ROWS = sum(SIZES)
BATCH = 32

# Environment variables a launch must not inherit from the pytest process.
RANK_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@dataclass(frozen=True)
class Launch:
    """A finished torchrun: its exit status and its output (stdout and stderr together)."""

    returncode: int
    output: str


def torchrun(
    script: str | Path,
    nproc: int,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    check: bool = True,
) -> Launch:
    """Run ``script`` under ``torchrun --standalone --nproc_per_node=nproc``.

    The ranks use the loopback interface for gloo, one OpenMP thread each, and can import this
    repository (``tests.*``). ``--standalone`` rendezvouses on a free port of its own, so
    launches never collide. The output goes to a file rather than a pipe: a rank killed hard
    leaves DataLoader workers that would hold a pipe open until their watchdog notices.

    Args:
        script: a file name in ``scripts/`` or a path.
        nproc: ranks.
        *args: the script's arguments.
        env: extra environment variables.
        timeout: seconds before the launch and everything it started is killed.
        check: fail the test on a non-zero exit.

    Returns:
        The exit status and output.
    """
    path = Path(script)
    if not path.is_absolute():
        path = SCRIPTS / path
    environment = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    pythonpath = [str(REPO), *filter(None, [environment.get("PYTHONPATH")])]
    environment.update(
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(pythonpath),
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
    )
    environment.update(env or {})
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "--monitor-interval=0.1",
        str(path),
        *args,
    ]
    with tempfile.TemporaryFile("w+") as log:
        # A session of its own: on a timeout, the ranks and their workers die with torchrun.
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=REPO,
            start_new_session=True,
        )
        timed_out = False
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = -signal.SIGKILL
        finally:
            _kill_group(process.pid)  # what a hard kill left behind, or all of it on a timeout
            process.wait()
        log.seek(0)
        output = log.read()
    name = path.name
    if timed_out:
        pytest.fail(f"torchrun {name} x{nproc} ran past {timeout} s:\n{output[-20_000:]}")
    if check and returncode != 0:
        pytest.fail(f"torchrun {name} x{nproc} exited {returncode}:\n{output[-20_000:]}")
    return Launch(returncode, output)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # nothing left
        os.killpg(pgid, signal.SIGKILL)


def run_script(
    script: str, nproc: int, spec: Mapping[str, Any], **kwargs: Any
) -> tuple[Any, Launch]:
    """`torchrun` ``script`` with ``--spec JSON``; return what rank 0 wrote to ``spec["out"]``."""
    launch = torchrun(script, nproc, "--spec", json.dumps(spec), **kwargs)
    return read_result(spec["out"], launch), launch


def read_result(path: str | Path, launch: Launch) -> Any:
    """The JSON result rank 0 wrote; fail with the launch's output if there is none."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        pytest.fail(f"no result at {path}; the launch said:\n{launch.output[-20_000:]}")


# --- checks ----------------------------------------------------------------------------------


def ids_of(batches: Iterable[Sequence[int]]) -> Counter[int]:
    """The multiset of ids in ``batches``."""
    return Counter(i for batch in batches for i in batch)


def assert_exactly_once(counts: Counter[int], universe: Iterable[int], *, missing: int) -> None:
    """Every id of ``counts`` is in ``universe``, none twice, and ``missing`` of it unread."""
    universe = set(universe)
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert not twice, f"read more than once: {twice[:20]}"
    strangers = sorted(set(counts) - universe)
    assert not strangers, f"ids not in the data: {strangers[:20]}"
    assert len(universe) - len(counts) == missing, (
        f"{len(universe) - len(counts)} ids not read, expected {missing}"
    )


# --- data ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``SIZES`` rows in five Parquet files with ids 0..ROWS-1 in file order."""
    root = tmp_path_factory.mktemp("distributed") / "data"
    start = 0
    for i, (size, group) in enumerate(zip(SIZES, ROW_GROUPS, strict=True)):
        write_parquet(
            root / f"part-{i:03d}.parquet", np.arange(start, start + size), row_group_size=group
        )
        start += size
    return root


@pytest.fixture(scope="session")
def csv_dataset_dir(dataset_dir: Path) -> Path:
    """The same rows as CSV files (``id``, ``x``, ``name``), plus a 0-byte file listed first."""
    root = dataset_dir.parent / "csv"
    root.mkdir()
    (root / "part-000-empty.csv").write_bytes(b"")
    for path in sorted(dataset_dir.glob("*.parquet")):
        table = pq.read_table(path, columns=["id", "x", "name"])
        pacsv.write_csv(table, root / f"{path.stem}.csv")
    return root


# The row group of `corrupt_dataset_dir` whose data page has a flipped bit: file 1, rows 100:200.
CORRUPT_IDS = range(251 + 100, 251 + 200)


@pytest.fixture(scope="session")
def corrupt_dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``SIZES`` rows as in `dataset_dir`, with page checksums, and one bit flipped in the data
    page of file 1's second row group (ids `CORRUPT_IDS`)."""
    root = tmp_path_factory.mktemp("distributed") / "corrupt"
    start = 0
    for i, (size, group) in enumerate(zip(SIZES, ROW_GROUPS, strict=True)):
        root.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            make_table(np.arange(start, start + size)),
            root / f"part-{i:03d}.parquet",
            row_group_size=group,
            write_page_checksum=True,
            compression="none",
        )
        start += size
    bad = root / "part-001.parquet"
    meta = pq.ParquetFile(bad).metadata
    column = meta.row_group(1).column(meta.schema.names.index("id"))
    data = bytearray(bad.read_bytes())
    data[column.data_page_offset + column.total_compressed_size - 8] ^= 0x10
    bad.write_bytes(bytes(data))
    return root


# Packed sequences (`packed_dataset`): 16 tokens a sequence, 2 sequences a batch, pads -1.
PACKING = {"column": "tokens", "seq_len": 16, "pad_value": -1}
PACKED_BATCH = 2


@dataclass(frozen=True)
class PackedData:
    """Token documents in Parquet: ``tokens`` ids ``0..tokens-1``, each in one document."""

    root: Path
    tokens: int


@pytest.fixture(scope="session")
def packed_dataset(tmp_path_factory: pytest.TempPathFactory) -> PackedData:
    """Four files of 50 documents of 0-29 tokens (row groups of 13 documents): 3,007 tokens,
    which neither 2 nor 3 ranks divide; per rank 47 batches of 32 tokens on 2 ranks, 32 on 3,
    the last one short."""
    root = tmp_path_factory.mktemp("distributed") / "packed"
    where = write_documents(root, 4, 50, seed=4, row_group_size=13)
    assert len(where) == max(where) + 1 == 3_007, len(where)
    return PackedData(root, len(where))


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for one module's results and checkpoints."""
    return tmp_path_factory.mktemp("runs")
