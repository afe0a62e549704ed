"""What a user must see of a WebDataset read: a value that does not decode names its shard and
sample key whatever the columns read, and the "every worker rescans" warning reaches stderr
with Python's default settings (no logging configured)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

import torch_dataloader_utils as tdu
from tests.conftest import first_error

pytestmark = pytest.mark.timeout(120)

BAD = 4  # the sample whose json does not parse


def write_shard(path: Path, n: int = 6, *, bad: int | None = BAD) -> Path:
    """Samples ``k000``.. with a ``json`` and a ``cls`` component; sample ``bad``'s json is
    broken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            body = b"{broken" if i == bad else json.dumps({"i": i}).encode()
            for ext, data in (("json", body), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"k{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def loader(shard: Path, **options: object) -> tdu.TabularDataLoader:
    options.setdefault("num_workers", 0)
    return tdu.create_dataloader(
        str(shard),
        format="webdataset",
        batch_size=4,
        format_options={"index_cache_dir": str(shard.parent / "cache")},
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("columns", [["json"], ["cls", "json"], None])
@pytest.mark.parametrize("output_format", ["torch", "dict"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_value_that_does_not_decode_names_shard_and_key(
    tmp_path: Path, columns: list[str] | None, output_format: str, workers: int
) -> None:
    shard = write_shard(tmp_path / "s.tar")
    error = first_error(
        loader(shard, columns=columns, output_format=output_format, num_workers=workers)
    )
    assert isinstance(error, tdu.CorruptFileError)
    assert f"{shard}: sample 'k{BAD:03d}', column 'json'" in str(error)
    assert "cannot decode a 'json' component" in str(error)


def test_columns_read_to_name_samples_are_left_out_of_batches(tmp_path: Path) -> None:
    good = write_shard(tmp_path / "s.tar", bad=None)
    for output_format in ("torch", "numpy", "dict"):
        batches = list(loader(good, columns=["json"], output_format=output_format))
        assert all(sorted(b) == ["json"] for b in batches)
        assert [v["i"] for b in batches for v in b["json"]] == list(range(6))


def test_a_skipped_value_names_its_shard(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "s.tar")
    skipping = loader(shard, columns=["json"], on_error="skip")
    batches = list(skipping)
    assert all(sorted(b) == ["json"] for b in batches)
    (failure,) = skipping.read_failures
    assert failure.file == str(shard) and failure.rows == f"sample 'k{BAD:03d}'"


def test_the_rescan_warning_reaches_stderr_without_logging_set_up(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "s.tar")
    script = textwrap.dedent(f"""
        import torch_dataloader_utils as tdu
        loader = tdu.create_dataloader(
            {str(shard)!r}, format="webdataset", columns=["cls"], num_workers=0,
            format_options={{"index_cache_dir": ""}},
        )
        print(sum(len(b["cls"]) for b in loader))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6"]
    assert "TorchDataloaderUtilsWarning" in done.stderr
    assert "scans every shard again" in done.stderr and "tdu index" in done.stderr
    assert done.stderr.count("cannot be cached") == 1  # once per process
