"""The keywords each dataset takes come from the fields of the option values, and agree with
the signatures that document them; a wrong one is refused once, naming where it goes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.dataset.keywords import MIXTURE_KEYWORDS, dataset_keywords
from torch_dataloader_utils.errors.keywords import keywords_of

TABLE_OWN = {"table", "catalog_config", "snapshot_id", "as_of", "ref", "from_snapshot_id"}


def test_a_dataset_of_files_takes_what_its_signature_documents() -> None:
    assert dataset_keywords("files") == keywords_of(tdu.StructuredDataset.__init__)[0]


def test_a_table_takes_the_files_keywords_but_the_path_and_its_own() -> None:
    files = keywords_of(tdu.StructuredDataset.__init__)[0]
    assert dataset_keywords("table") == (files - {"path"}) | TABLE_OWN
    assert keywords_of(tdu.IcebergDataset.__init__)[0] <= dataset_keywords("table")


def test_a_mixture_takes_its_own_the_options_and_every_sources() -> None:
    mixture = dataset_keywords("mixture")
    assert keywords_of(tdu.MixtureDataset.__init__)[0] <= mixture
    assert mixture >= MIXTURE_KEYWORDS and "shuffle_seed" in mixture and "columns" in mixture
    # a source's own options are not a mixture's: they go in its tdu.Source
    assert not {"path", "table", "weight", "snapshot_id"} & mixture


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("keywords")
    pq.write_table(pa.table({"id": np.arange(20)}), root / "part-0.parquet")
    return root


def test_a_subclass_with_a_keyword_of_its_own_takes_it(data: Path) -> None:
    class Tagged(tdu.StructuredDataset):
        def __init__(self, path: str, format: str = "parquet", *, tag: str = "", **kw: object):
            self.tag = tag
            super().__init__(path, format, **kw)  # type: ignore[arg-type]

    dataset = Tagged(str(data), tag="t", batch_size=4)
    assert dataset.tag == "t"
    assert sorted(i for b in dataset for i in b["id"].tolist()) == list(range(20))
    with pytest.raises(tdu.UnknownKeywordError, match=r"^Tagged got .*'tga' \(did you mean 'tag'"):
        Tagged(str(data), tga="t")


def test_a_source_option_given_to_a_mixture_says_where_it_goes(data: Path) -> None:
    with pytest.raises(tdu.UnknownKeywordError, match=r"'weight' \(an option of one source"):
        tdu.MixtureDataset([tdu.Source(str(data))], weight=2)
    with pytest.raises(tdu.UnknownKeywordError, match=r"'num_worker' \(did you mean 'num_workers'"):
        tdu.create_dataloader([tdu.Source(str(data))], num_worker=0)


def test_a_mixture_is_a_planned_dataset_not_a_dataset_of_files(data: Path) -> None:
    mixture = tdu.MixtureDataset([tdu.Source(str(data)), tdu.Source(str(data))], batch_size=5)
    assert not isinstance(mixture, tdu.StructuredDataset)
    assert (mixture.batch_size, mixture.shuffle) == (5, False)
    loader, same = tdu.MixtureDataset.create_dataloader(
        [tdu.Source(str(data)), tdu.Source(str(data))], batch_size=5, num_workers=0
    )
    ids = sorted(i for b in loader for i in b["id"].tolist())
    assert ids == sorted([*range(20), *range(20)]) and same is loader.dataset
