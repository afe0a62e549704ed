"""The values a loader is built from (`Source`, `Options`, `LoaderOptions`): each checks itself
when made, and the public keyword names reach the right one."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.convert import Output
from torch_dataloader_utils.options import (
    EVERY_SOURCE,
    LOADER_KEYWORDS,
    LoaderOptions,
    Options,
    Source,
    with_defaults,
)
from torch_dataloader_utils.planning import Topology

pytestmark = pytest.mark.timeout(120)


def test_the_public_names_reach_the_dataset_options_and_the_rest_stay_a_sources() -> None:
    options, rest = Options.split(
        {
            "batch_size": 7,
            "output_format": "numpy",
            "pad_value": -1,
            "num_ranks": 2,
            "columns": ["id"],
            "split_rows": 10,
        }
    )
    assert options.batch_size == 7 and options.world_size == 2
    assert options.output == Output(format="numpy", pad_value=-1)
    assert rest == {"columns": ["id"], "split_rows": 10}
    with pytest.raises(tdu.InvalidArgumentError, match="disagree"):
        Options.split({"num_ranks": 2, "world_size": 3})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (Source, "either path= .files, or a Delta or Lance table. or table="),
        (lambda: Source("a/", table="db.t"), "either path="),
        (lambda: Source("a/", weight=-1), "weight must be >= 0"),
        (lambda: Source("a/", columns=[]), "at least one column"),
        (lambda: Source("a/", split_rows=0), "split_rows must be a positive integer"),
        (lambda: Source("a/", partitioning="dir"), "partitioning must be None or"),
        (lambda: Source(table="db.t", partitioning="hive"), "does not apply to Iceberg"),
        (lambda: Options(batch_size=0), "batch_size must be a positive integer"),
        (lambda: Options(shuffle="yes"), "shuffle must be True or False"),  # type: ignore[arg-type]
        (lambda: Options(remainder="keep"), "remainder must be one of"),  # type: ignore[arg-type]
        (lambda: LoaderOptions(num_workers=-1), "num_workers must be >= 0"),
        (lambda: LoaderOptions(num_workers=0, persistent_workers=True), "needs num_workers"),
    ],
)
def test_each_value_refuses_what_is_out_of_range_when_made(make: Any, message: str) -> None:
    with pytest.raises(tdu.InvalidArgumentError, match=message):
        make()


def test_a_mixture_gives_its_sources_only_the_options_they_leave_unset() -> None:
    assert set(EVERY_SOURCE) == {
        "columns",
        "filters",
        "storage_options",
        "format_options",
        "partitioning",
        "split_bytes",
        "split_rows",
        "retries",
        "catalog_config",
        "tokenize",
        "transform",
    }
    own = Source("a/", columns=["x"])
    given = with_defaults(own, {"columns": ["y"], "split_rows": 5})
    assert given.columns == ["x"] and given.split_rows == 5
    assert not set(LOADER_KEYWORDS) & {f for f in Options.__dataclass_fields__}


def test_a_mixtures_pieces_are_numbered_as_its_plan_and_read_every_row_once(
    parquet_dir: Any,
) -> None:
    first, _ = parquet_dir((30, 20), row_group_size=10, name="a")
    second, _ = parquet_dir((25,), row_group_size=10, name="b")
    dataset = tdu.MixtureDataset(
        [tdu.Source(str(first)), tdu.Source(str(second))], batch_size=5, shuffle=True
    )
    chunks = dataset.plan.chunks
    ids: Counter[int] = Counter()
    for worker in range(2):
        for piece in dataset.pieces(Topology(0, 1, worker, 2), epoch=1):
            chunk = chunks[piece.chunk]
            column = pq.read_table(chunk.path, columns=["id"]).column("id").to_pylist()
            first = chunk.start * 10  # the chunk's row group's first row (groups of 10 rows)
            ids.update(column[first + piece.start : first + piece.stop])
    # Every row of both sources once (the quotas are the sources' rows); the second source's
    # ids restart at 0, so each id below 25 comes from both sources.
    assert ids == Counter([*range(50), *range(25)])


def test_a_mixtures_create_dataloader_gives_the_loader_and_the_mixture_their_keywords(
    parquet_dir: Any,
) -> None:
    first, _ = parquet_dir((30,), name="a")
    second, _ = parquet_dir((20,), name="b")
    loader, dataset = tdu.MixtureDataset.create_dataloader(
        [tdu.Source(str(first)), tdu.Source(str(second))],
        batch_size=5,
        num_workers=0,
        source_column="src",
    )
    assert isinstance(dataset, tdu.MixtureDataset) and loader.dataset is dataset
    assert loader.num_workers == 0 and dataset.batch_size == 5
    sources = Counter(s for batch in loader for s in batch["src"].tolist())
    assert sources == {0: 30, 1: 20}
    with pytest.raises(tdu.UnknownKeywordError, match=r"did you mean 'num_workers'\?"):
        tdu.MixtureDataset.create_dataloader([tdu.Source(str(first))], num_worker=0)
