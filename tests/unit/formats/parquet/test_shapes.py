"""Footers of one shape (`formats.parquet.shapes`): a footer read by a shape learned before
gives exactly what the walk gives, on files of many writers and on footers changed byte by
byte; a footer the shape does not cover is walked."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.errors import CorruptFileError, UnsupportedFileError
from torch_dataloader_utils.formats import ReadOptions
from torch_dataloader_utils.formats.parquet import shapes
from torch_dataloader_utils.formats.parquet.facts import read_facts
from torch_dataloader_utils.formats.parquet.footer import (
    Footer,
    _file_meta,
    parse_footer,
    read_tail,
)
from torch_dataloader_utils.formats.parquet.thrift import ThriftError
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile

CORPUS = Path(__file__).resolve().parents[5] / "shared" / "realworld-data"
FS = FileSystemSpec("file")


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    shapes.clear()
    yield
    shapes.clear()


def _tail(path: Path) -> tuple[bytes, int]:
    with pa.OSFile(str(path)) as source:
        size = source.size()
        return read_tail(source, size, str(path))[0], size


def _walked(thrift: bytes, size: int) -> Footer | str:
    """The footer as the walk alone parses it, or the error it raises."""
    shapes.clear()
    try:
        return parse_footer(thrift, "f.parquet", size)
    except (CorruptFileError, UnsupportedFileError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _learned(thrift: bytes) -> bool:
    """Learn ``thrift``'s shape (a length seen twice); whether it was kept."""
    shapes.clear()
    walk = _file_meta(thrift)
    shapes.learn(thrift, walk)
    shapes.learn(thrift, walk)
    return shapes.walked(thrift) is not None


def _written(root: Path) -> list[Path]:
    n = 200
    ids = np.arange(n)
    tables = {
        "flat": pa.table({"id": ids, "x": ids.astype(np.float32), "s": [f"v{i % 7}" for i in ids]}),
        "nested": pa.table(
            {
                "l": [[i, i + 1] for i in range(n)],
                "st": [{"a": i, "b": str(i)} for i in range(n)],
                "m": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
            }
        ),
        "bools": pa.table({"b": [i % 3 == 0 for i in ids], "d": ids.astype(np.float64)}),
    }
    paths = []
    for name, table in tables.items():
        for compression, group in (("snappy", 64), ("none", 1000), ("zstd", 7)):
            path = root / f"{name}-{compression}-{group}.parquet"
            pq.write_table(table, path, compression=compression, row_group_size=group)
            paths.append(path)
    return paths


def _corpus_files() -> list[Path]:
    if not CORPUS.is_dir():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"no corpus at {CORPUS}")
        pytest.skip(f"no corpus at {CORPUS}")
    return sorted(CORPUS.rglob("*.parquet"))


def _value_bytes(thrift: bytes) -> list[int]:
    """The offsets of bytes the shape lets differ (integers' values, strings' bytes)."""
    assert _learned(thrift)
    (shape,) = shapes._known[len(thrift)]
    fixed = shape.fixed.to_bytes(len(thrift), "little")
    return [k for k, b in enumerate(fixed) if b != 0xFF]


def _agrees(thrift: bytes, changed: bytes, size: int) -> bool:
    """Whether the shape learned from ``thrift`` reads ``changed`` as the walk does (True when
    it read it, False when it left it to the walk)."""
    assert _learned(thrift)
    by_shape = shapes.walked(changed)
    try:
        read = parse_footer(changed, "f.parquet", size)
    except (CorruptFileError, UnsupportedFileError) as exc:
        read = f"{type(exc).__name__}: {exc}"
    assert read == _walked(changed, size)
    if by_shape is not None:
        assert by_shape == _file_meta(changed)
    return by_shape is not None


def test_files_of_one_writer_read_by_their_shape_give_what_the_walk_gives(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for i in range(40):  # rows, values, sizes and offsets differ from file to file
        rows = 50 + int(rng.integers(0, 3))
        table = pa.table(
            {
                "id": pa.array(np.arange(i * 100, i * 100 + rows, dtype=np.int64)),
                "x": pa.array(rng.random(rows, dtype=np.float32)),
            }
        )
        pq.write_table(table, tmp_path / f"part-{i:03d}.parquet")
    paths = sorted(tmp_path.glob("*.parquet"))
    read = []
    for p in paths:
        thrift, size = _tail(p)
        read.append(parse_footer(thrift, str(p), size))
    hits = shapes._tally[0]
    assert hits >= 30  # (the test would pass without shapes: make sure they were used)
    walked = []
    for p in paths:
        thrift, size = _tail(p)
        shapes.clear()
        walked.append(parse_footer(thrift, str(p), size))
    assert read == walked
    # And the facts planning keeps, file by file, with and without shapes.
    shapes.clear()
    facts = [
        read_facts(ListedFile(str(p), p.stat().st_size, ""), (), FS, ReadOptions()) for p in paths
    ]
    assert shapes._tally[0] >= 30
    for p, kept in zip(paths, facts, strict=True):
        shapes.clear()
        alone = read_facts(ListedFile(str(p), p.stat().st_size, ""), (), FS, ReadOptions())
        assert (kept.row_groups, kept.schema) == (alone.row_groups, alone.schema)
    assert sum(r[1] for f in facts for r in f.row_groups) == sum(
        pq.read_metadata(p).num_rows for p in paths
    )


def test_every_written_and_real_world_footer_learned_reads_itself_as_walked(tmp_path: Path) -> None:
    paths = _written(tmp_path) + _corpus_files()
    learned = 0
    for path in paths:
        try:
            thrift, size = _tail(path)
            walk = _file_meta(thrift)
            parse_footer(thrift, str(path), size)
        except (CorruptFileError, UnsupportedFileError, ThriftError, IndexError, OSError):
            continue  # (the corpus holds bad files on purpose: nothing to learn from them)
        if _learned(thrift):
            learned += 1
            assert shapes.walked(thrift) == walk, path
    assert learned >= 40, learned


@pytest.mark.parametrize("seed", range(3))
def test_changed_values_are_read_by_the_shape_and_agree_with_the_walk(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    read = tries = 0
    for path in _written(tmp_path):
        thrift, size = _tail(path)
        values = _value_bytes(thrift)
        for _ in range(40):
            changed = bytearray(thrift)
            for k in rng.sample(values, min(len(values), rng.randint(1, 6))):
                changed[k] = (changed[k] & 0x80) | rng.randrange(0x80)  # (the high bit kept)
            read += _agrees(thrift, bytes(changed), size)
            tries += 1
    assert read == tries  # every such change is read by the shape


@pytest.mark.parametrize("seed", range(3))
def test_any_other_change_is_left_to_the_walk_or_agrees_with_it(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    left = 0
    for path in _written(tmp_path)[::2]:
        thrift, size = _tail(path)
        for _ in range(60):
            changed = bytearray(thrift)
            for _ in range(rng.randint(1, 3)):
                changed[rng.randrange(len(changed))] = rng.choice(
                    [0x00, 0x0F, 0x15, 0x19, 0x1C, 0x26, 0x7F, 0x80, 0xFF, rng.randrange(256)]
                )
            left += not _agrees(thrift, bytes(changed), size)
    assert left > 100


def test_a_string_of_another_length_is_another_shape(tmp_path: Path) -> None:
    for name, text in (("a", "short"), ("b", "longer text")):
        pq.write_table(pa.table({"s": [text] * 5}), tmp_path / f"{name}.parquet")
    (a, _), (b, size_b) = _tail(tmp_path / "a.parquet"), _tail(tmp_path / "b.parquet")
    assert _learned(a)
    assert shapes.walked(b) is None
    assert parse_footer(b, "b", size_b) == _walked(b, size_b)


def test_shapes_never_repeated_are_not_learned_and_learning_waits_on_hits(tmp_path: Path) -> None:
    thrifts = []
    for i in range(6):  # six files of six footer lengths (a string column's statistics)
        pq.write_table(pa.table({"s": ["x" * (i + 1)] * 3}), tmp_path / f"{i}.parquet")
        thrifts.append(_tail(tmp_path / f"{i}.parquet"))
    shapes.clear()
    for thrift, size in thrifts:
        parse_footer(thrift, "f", size)
    assert shapes._tally == [0, 0] and not shapes._known
    # Each length twice in a row: two shapes are learned, then none while none is read.
    shapes.clear()
    for thrift, size in thrifts:
        parse_footer(thrift, "f", size)
        parse_footer(thrift + b"", "f", size)
    assert shapes._tally[1] == 2
