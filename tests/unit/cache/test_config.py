"""Cache settings: sizes, the job-wide environment variables, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils import InvalidArgumentError
from torch_dataloader_utils.cache import CacheConfig, RangeStore, file_key, parse_size
from torch_dataloader_utils.cli import main


@pytest.mark.parametrize(
    ("given", "size"),
    [(1000, 1000), ("50GB", 50 * 10**9), ("512MiB", 512 << 20), ("1.5 kb", 1500), ("7", 7)],
)
def test_sizes(given: int | str, size: int) -> None:
    assert parse_size(given) == size


@pytest.mark.parametrize("given", ["lots", "5 parsecs", -1, 0, "0GB", True, 1.5])
def test_what_is_not_a_size_is_refused_by_name(given: object) -> None:
    with pytest.raises(InvalidArgumentError, match="cache_limit"):
        parse_size(given)  # type: ignore[arg-type]


def test_the_environment_sets_a_cache_for_a_whole_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CacheConfig.of(None, None) is None
    monkeypatch.setenv("TDU_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("TDU_CACHE_LIMIT", "2GB")
    config = CacheConfig.of(None, None)
    assert config is not None and config.directory == str(tmp_path / "c") and config.limit == 2e9
    assert CacheConfig.of("", None) is None  # one loader turns the job's cache off
    given = CacheConfig.of(tmp_path / "mine", "1GiB")  # an argument wins
    assert given is not None and given.directory == str(tmp_path / "mine")
    assert given.limit == 1 << 30


def test_refusals_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="needs a cache_dir"):
        CacheConfig.of(None, "1GB")
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(InvalidArgumentError, match="is a file"):
        CacheConfig.of(a_file, None)


def test_a_local_source_is_read_uncached(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "a.parquet")
    loader = tdu.create_dataloader(
        str(tmp_path / "a.parquet"), batch_size=10, cache_dir=tmp_path / "cache"
    )
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(100))
    stats = loader.cache_stats
    assert stats is not None and (stats.hits, stats.misses) == (0, 0)
    # No data cached, only the plan kept (local sources' plans are kept too: sources.kept).
    held = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and "lock" not in str(p)]
    assert {p.parent.name for p in held} == {"tdu-plans-v1"}


def test_tdu_cache_shows_and_clears(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = RangeStore(CacheConfig(str(tmp_path)))
    for i in range(3):
        key = file_key(f"s3://b/{i}", 10**6, "v")
        store.put(key, 0, b"a" * 1000)
        store.put(key, 1000, b"b" * 1000)
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": list(range(10))}), data / "a.parquet")
    tdu.create_dataloader(str(data), batch_size=5, cache_dir=tmp_path)  # (a kept plan)
    assert main(["cache", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "6 ranges of 3 files" in out and "1 kept plans" in out
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert "cleared" in capsys.readouterr().out
    assert main(["cache", "show", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0 ranges of 0 files" in out and "0 kept plans" in out
