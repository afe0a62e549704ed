"""The bad-input corpus: files of every format damaged as the field damages them.

Each case is a small file written here (ids 0..N-1 with a string and a float per row), then
damaged: truncated at many offsets, bits flipped (Parquet with and without page checksums),
strings that are not UTF-8, an unclosed CSV quote, a tar shard cut between or inside members,
or changed between planning and reading (replaced, appended, truncated, deleted). Each is read
by the corpus runner's child process (`tests.corpus.pool`, a crash or a hang fails one case) and
compared with the format's reference reader on the damaged file.

An outcome is acceptable when the library

- delivers exactly the reference's rows (the damage left a valid file, or one both read alike:
  a flipped bit in a Parquet page without checksums or in a CSV digit is undetectable), or
- refuses with one of its own errors naming the file;

never when it delivers other rows than the reference, or rows where the reference fails, or
raises an error that is not the library's, or one that does not name the file. A file changed
after planning must be refused (`FileChangedError`, or `StorageNotFoundError` once deleted).

``python -m tests.corpus.bad_input`` prints the table of cases and outcomes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.ipc as ipc
import pyarrow.orc as orc
import pyarrow.parquet as pq

from tests.corpus.cases import Case
from tests.corpus.pool import Runner

ROWS = 300
FORMATS = ("parquet", "orc", "ipc", "csv", "json", "webdataset")
SUFFIX = {
    "parquet": "parquet",
    "orc": "orc",
    "ipc": "arrow",
    "csv": "csv",
    "json": "jsonl",
    "webdataset": "tar",
}
# Seconds per read (planning, 2 workers started, the reference read and the comparison).
TIMEOUT = 120


def table(rows: int = ROWS, start: int = 0) -> pa.Table:
    ids = list(range(start, start + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"row-{i:05d}" for i in ids]),
            "value": pa.array([i / 4 for i in ids], pa.float64()),
        }
    )


def write(fmt: str, path: Path, data: pa.Table, **options: Any) -> Path:
    """``data`` as a ``fmt`` file (several row groups, stripes, batches or members)."""
    if fmt == "parquet":
        pq.write_table(
            data,
            path,
            row_group_size=100,
            write_page_checksum=options.get("checksums", False),
            compression=options.get("compression", "snappy"),
        )
    elif fmt == "orc":
        orc.write_table(data, path, stripe_size=1, batch_size=100, compression="uncompressed")
    elif fmt == "ipc":
        with ipc.new_file(str(path), data.schema) as writer:
            writer.write_table(data, max_chunksize=100)
    elif fmt == "csv":
        pcsv.write_csv(data, path)
    elif fmt == "json":
        with open(path, "w") as f:
            for row in data.to_pylist():
                f.write(json.dumps(row) + "\n")
    elif fmt == "webdataset":
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for row in data.to_pylist():
                key = f"{row['id']:06d}"
                for ext, value in (("id", str(row["id"])), ("txt", row["name"])):
                    payload = value.encode()
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    else:
        raise AssertionError(fmt)
    return path


def _flip(data: bytearray, offset: int) -> None:
    data[offset] ^= 0x10


@dataclass
class BadCase:
    """One damaged file: how to make it, and what may come of reading it."""

    name: str
    fmt: str
    damage: Callable[[Path], None]  # changes the file before planning
    after_planning: dict[str, Any] | None = None  # or between planning and reading
    options: dict[str, Any] = field(default_factory=dict)  # the writer's options
    must_refuse: bool = False  # only a library error naming the file will do
    case_options: dict[str, Any] = field(default_factory=dict)  # the loader's format_options
    expect: str = ""  # what a refusal's message must say


def _truncate_at(fraction: float) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(max(1, min(size - 1, int(size * fraction))))

    return damage


def _flip_at(fraction: float) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        _flip(data, min(len(data) - 1, int(len(data) * fraction)))
        path.write_bytes(bytes(data))

    return damage


def _replace_bytes(old: bytes, new: bytes, count: int = 1) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = path.read_bytes()
        assert old in data, (path, old)
        path.write_bytes(data.replace(old, new, count))

    return damage


def _intact(path: Path) -> None:
    return None


def _cut_tar(members: int) -> Callable[[Path], None]:
    """Keep the first ``members`` whole members, without the end-of-archive blocks."""

    def damage(path: Path) -> None:
        with tarfile.open(path) as tar:
            kept = tar.getmembers()[members]
        with open(path, "r+b") as f:
            f.truncate(kept.offset)

    return damage


def _written_as(fmt: str) -> Callable[[Path], None]:
    """Replace the file with the same rows written as ``fmt`` (read as another format)."""

    def damage(path: Path) -> None:
        other = write(fmt, path.with_name(f"other.{SUFFIX[fmt]}"), table())
        path.write_bytes(other.read_bytes())

    return damage


def cases() -> list[BadCase]:
    found: list[BadCase] = []
    for fmt in FORMATS:
        for fraction in (0.05, 0.3, 0.5, 0.8, 0.97, 0.999):
            found.append(BadCase(f"truncated at {fraction:.1%}", fmt, _truncate_at(fraction)))
        for fraction in (0.2, 0.5, 0.9):
            found.append(BadCase(f"bit flip at {fraction:.0%}", fmt, _flip_at(fraction)))
        found += [
            BadCase(
                "replaced after planning (same size)",
                fmt,
                _intact,
                {"action": "replace", "source": "same-size"},
                must_refuse=True,
            ),
            BadCase(
                "rows appended after planning",
                fmt,
                _intact,
                {"action": "append", "source": "more"},
                must_refuse=True,
            ),
            BadCase(
                "truncated after planning",
                fmt,
                _intact,
                {"action": "truncate", "size": 0.6},
                must_refuse=True,
            ),
            BadCase("deleted after planning", fmt, _intact, {"action": "delete"}, must_refuse=True),
        ]
    for fraction in (0.2, 0.5, 0.9):
        found.append(
            BadCase(
                f"bit flip at {fraction:.0%}, page checksums",
                "parquet",
                _flip_at(fraction),
                options={"checksums": True, "compression": "none"},
            )
        )
    found += [
        BadCase(
            "string not UTF-8",
            "parquet",
            _replace_bytes(b"row-00150", b"row-\xff0150"),
            options={"compression": "none"},
        ),
        BadCase("string not UTF-8", "csv", _replace_bytes(b"row-00150", b"row-\xff0150")),
        BadCase("string not UTF-8", "json", _replace_bytes(b"row-00150", b"row-\xff0150")),
        BadCase("string not UTF-8", "orc", _replace_bytes(b"row-00150", b"row-\xff0150")),
        BadCase("string not UTF-8", "ipc", _replace_bytes(b"row-00150", b"row-\xff0150")),
        BadCase("unclosed quote", "csv", _replace_bytes(b'"row-00150"', b'"row-00150')),
        BadCase(
            "unclosed quote, later quotes", "csv", _replace_bytes(b'"row-00100"', b'"row-00100')
        ),
        BadCase("shard cut between members", "webdataset", _cut_tar(301)),
        BadCase("shard cut between samples", "webdataset", _cut_tar(300)),
        BadCase("shard cut inside a member", "webdataset", _truncate_at(0.5)),
    ]
    # A file of another format (format= wrong, or left at its default): refused saying which.
    for fmt, other, says in (
        ("csv", "parquet", "this looks like Parquet: pass format='parquet'"),
        ("json", "parquet", "this looks like Parquet: pass format='parquet'"),
        ("csv", "orc", "this looks like ORC: pass format='orc'"),
        ("csv", "ipc", "this looks like Arrow IPC: pass format='ipc'"),
        ("json", "webdataset", "this looks like a tar archive: pass format='webdataset'"),
        ("orc", "csv", "this looks like CSV/JSON text"),
        ("ipc", "json", "this looks like CSV/JSON text"),
        ("orc", "parquet", "this looks like Parquet: pass format='parquet'"),
        ("ipc", "orc", "this looks like ORC: pass format='orc'"),
        ("parquet", "csv", "this looks like CSV/JSON text"),
        ("parquet", "json", "this looks like CSV/JSON text"),
        ("parquet", "orc", "this looks like ORC: pass format='orc'"),
    ):
        found.append(
            BadCase(f"a {other} file", fmt, _written_as(other), must_refuse=True, expect=says)
        )
    return found


def _same_size(path: Path) -> Path:
    """A rewrite of ``path``: its exact size, one byte other (the same name written again)."""
    data = bytearray(path.read_bytes())
    _flip(data, len(data) // 2)
    out = path.with_name("same-size-" + path.name)
    out.write_bytes(bytes(data))
    return out


def request(case: BadCase, root: Path, workers: int, output: str) -> dict[str, Any]:
    """Write and damage ``case``'s file under ``root``; the runner's request to read it."""
    folder = root / f"{case.fmt}-{abs(hash(case.name)) % 10**8}-{workers}-{output}"
    folder.mkdir(parents=True)
    path = write(case.fmt, folder / f"data.{SUFFIX[case.fmt]}", table(), **case.options)
    case.damage(path)
    change = None
    if case.after_planning is not None:
        change = dict(case.after_planning)
        if change.get("source") == "same-size":
            change["source"] = str(_same_size(path))
        elif change.get("source") == "more":
            more = write(case.fmt, folder / f"more.{SUFFIX[case.fmt]}", table(50, ROWS))
            change["source"] = str(more)
        if "size" in change:
            change["size"] = int(path.stat().st_size * change["size"])
    options = {"missing_component": "empty", "decode": False} if case.fmt == "webdataset" else {}
    config = {
        "workers": workers,
        "output": output,
        "shuffle": True,
        "batch_size": 16,
        "after_planning": change,
    }
    bad = Case(str(path), case.fmt, {**options, **case.case_options}, ipc_kind="file")
    return {"case": dataclasses.asdict(bad), "config": config}


def problem(case: BadCase, verdict: dict[str, Any]) -> str | None:
    """Why ``verdict`` is not acceptable for ``case`` (None: it is)."""
    outcome = verdict["verdict"]
    if outcome == "refused" and case.expect not in verdict["error"]["message"]:
        return f"refused without saying {case.expect!r}: {json.dumps(verdict, default=str)[:1500]}"
    if outcome == "refused":
        return None
    if outcome == "match" and not case.must_refuse:
        return None
    return f"{outcome}: {json.dumps(verdict, default=str)[:1500]}"


def outcome(verdict: dict[str, Any]) -> str:
    """One table cell: the verdict, and the error's class when refused."""
    if verdict["verdict"] == "refused":
        return f"{verdict['error']['type']} ({verdict['stage']})"
    if verdict["verdict"] == "match":
        same = "valid" if verdict.get("reference") == "ok" else "?"
        return f"rows as pyarrow ({same})"
    return verdict["verdict"]


def main() -> None:
    """Print the table: case by format, the outcome with 0 and 2 workers."""
    runner = Runner()
    rows: Counter[str] = Counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print("| case | format | 0 workers | 2 workers | ok |")
            print("|---|---|---|---|---|")
            for case in cases():
                cells = []
                bad = []
                for workers in (0, 2):
                    verdict = runner.run(request(case, Path(tmp), workers, "torch"), TIMEOUT)
                    cells.append(outcome(verdict))
                    bad.append(problem(case, verdict))
                ok = "yes" if not any(bad) else "NO"
                rows[ok] += 1
                print(f"| {case.name} | {case.fmt} | {cells[0]} | {cells[1]} | {ok} |")
    finally:
        runner.close()
    print(f"\n{dict(rows)}", file=sys.stderr)


if __name__ == "__main__":
    main()
