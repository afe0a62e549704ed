"""What a format plans (`formats.base.Listing`): the files as listed, each with its partition,
one value instead of two sequences that must agree."""

from __future__ import annotations

import pytest

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.formats import Listing
from torch_dataloader_utils.fs import ListedFile

FILES = [ListedFile(f"/data/k={i}/part-{i}.parquet", 10 + i, "/data", f"v{i}") for i in range(4)]
PARTITIONS = [(("k", i),) for i in range(4)]


def test_a_listing_without_partitions_has_an_empty_one_per_file() -> None:
    listing = Listing.of(FILES)
    assert len(listing) == 4
    assert listing.files == tuple(FILES)
    assert listing.partitions == ((),) * 4


def test_a_share_keeps_each_file_with_its_partition() -> None:
    share = Listing.of(FILES, PARTITIONS).take([3, 1])
    assert share.files == (FILES[3], FILES[1])
    assert share.partitions == ((("k", 3),), (("k", 1),))
    assert Listing.of(FILES).take([]) == Listing((), ())


def test_the_identities_are_each_files_size_and_version() -> None:
    assert Listing.of(FILES[:2]).identities == {
        "/data/k=0/part-0.parquet": (10, "v0"),
        "/data/k=1/part-1.parquet": (11, "v1"),
    }


def test_files_and_partitions_that_do_not_pair_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="4 files has 3 partitions"):
        Listing.of(FILES, PARTITIONS[:3])
