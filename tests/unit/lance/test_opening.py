"""Opening a Lance dataset and resolving the version asked for (`lance.opening`), on a dataset
pylance writes: version numbers, tags and times resolved, each refusal naming the dataset and the
versions there are; pylance missing is named with its extra, and never imported by the
package."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from torch_dataloader_utils import (
    InvalidArgumentError,
    MissingDependencyError,
    StorageNotFoundError,
)
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.lance.opening import (
    _listed,
    _micros,
    dataset_uri,
    open_dataset,
    resolve_version,
)
from torch_dataloader_utils.lance.table import LanceTables
from torch_dataloader_utils.sources.tables import VersionSelector

LABEL = "Lance dataset t.lance"


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[datetime]]:
    """A dataset of three versions (one row each), and a time after each commit."""
    uri = str(tmp_path_factory.mktemp("opening") / "t.lance")
    after = []
    for i in range(3):
        lance.write_dataset(pa.table({"id": [i]}), uri, mode="create" if i == 0 else "append")
        time.sleep(0.02)
        after.append(datetime.now(timezone.utc))
        time.sleep(0.02)
    lance.dataset(uri).tags.create("first", 1)
    return uri, after


def _resolve(uri: str, **asked: object) -> int | str:
    return resolve_version(lance.dataset(uri), VersionSelector(**asked), LABEL)  # type: ignore[arg-type]


def test_versions_are_resolved_by_number_tag_and_time(
    versions: tuple[str, list[datetime]],
) -> None:
    uri, after = versions
    assert _resolve(uri) == 3
    assert _resolve(uri, version=2) == _resolve(uri, version="2") == 2
    assert _resolve(uri, version="first") == _resolve(uri, ref="first") == "first"
    assert [_resolve(uri, as_of=t) for t in after] == [1, 2, 3]
    assert _resolve(uri, as_of=round(after[1].timestamp() * 1000)) == 2  # epoch ms
    local = after[0].astimezone().replace(tzinfo=None)  # naive: local time
    assert _resolve(uri, as_of=local) == 1
    assert open_dataset(uri, "first", LABEL).version == 1


def test_refusals_name_the_dataset_and_its_versions(versions: tuple[str, list[datetime]]) -> None:
    uri, after = versions
    for asked, message in [
        ({"version": 4}, "Lance dataset t.lance has no version 4; its versions: 1, 2, 3"),
        ({"as_of": after[0] - timedelta(days=1)}, "no version at or before as_of=.*versions: 1"),
        ({"as_of": "noon"}, "as_of must be a datetime"),
        ({"version": 1.5}, "version must be an int or a tag"),
        ({"version": 1, "ref": "first"}, "at most one of version, as_of and ref"),
        ({"since": 1}, "not read incrementally"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            _resolve(uri, **asked)
    with pytest.raises(InvalidArgumentError, match=r"t.lance has no version 'nope'"):
        open_dataset(uri, "nope", LABEL)
    with pytest.raises(StorageNotFoundError, match=r"t.lance: no Lance dataset at .*gone.lance"):
        open_dataset(uri.replace("t.lance", "gone.lance"), None, LABEL)


def test_helpers() -> None:
    assert _listed([1, 2, 3]) == "1, 2, 3"
    many = _listed(list(range(1, 101)))
    assert many.startswith("1, 2,") and "(100 in all)" in many and many.endswith("99, 100")
    assert _micros(0) == 0 and _micros(5) == 5000
    assert _micros(datetime(1970, 1, 1, 0, 0, 1, 7, tzinfo=timezone.utc)) == 1_000_007
    local = FileSystemSpec("file")
    assert dataset_uri("rel/t.lance", local) == str(Path("rel/t.lance").resolve())
    assert dataset_uri("s3://bucket/t.lance", FileSystemSpec("s3")) == "s3://bucket/t.lance"


def test_a_missing_pylance_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lance", None)  # type: ignore[arg-type]
    with pytest.raises(MissingDependencyError, match=r"torch-dataloader-utils\[lance\]"):
        LanceTables()


def test_importing_the_package_imports_no_pylance() -> None:
    code = (
        "import sys, torch_dataloader_utils, torch_dataloader_utils.lance\n"
        "import torch_dataloader_utils.lance.table\n"
        "assert 'lance' not in sys.modules, 'pylance imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
