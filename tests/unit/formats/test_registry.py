"""The format registry: `register_format` by module path, and formats installed packages declare
in the ``torch_dataloader_utils.formats`` entry-point group. Plug-in modules and their
distribution metadata are real files on ``sys.path``."""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import write_parquet
from torch_dataloader_utils.errors import InvalidArgumentError, UnknownFormatError
from torch_dataloader_utils.formats import ENTRY_POINT_GROUP, registry
from torch_dataloader_utils.formats.parquet import ParquetFormat

# A plug-in: Parquet that counts the reads made through it, with an option of its own.
PLUGIN = """
from torch_dataloader_utils.formats.parquet import ParquetFormat

NOT_A_FORMAT = 3


class CountingParquet(ParquetFormat):
    reads = 0

    def __init__(self, *, tag="", **options):
        super().__init__(**options)
        self.tag = tag

    def read(self, chunk, row_start, row_stop, fs, options):
        type(self).reads += 1
        yield from super().read(chunk, row_start, row_stop, fs, options)
"""


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations stay inside the test."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))
    monkeypatch.setattr(registry, "_entry_points_read", False)


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a fresh plug-in module on ``sys.path`` (not imported)."""
    name = f"tdu_plugin_{uuid.uuid4().hex}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    write_parquet(root / "a.parquet", np.arange(0, 60), row_group_size=16)
    write_parquet(root / "b.parquet", np.arange(60, 100), row_group_size=16)
    return root


def read_ids(loader: tdu.TabularDataLoader) -> Counter[int]:
    return Counter(i for batch in loader for i in batch["id"].tolist())


def test_a_format_registered_by_module_path_is_imported_on_use_and_reads(
    plugin: str, data: Path
) -> None:
    tdu.register_format("Counting-Parquet", f"{plugin}:CountingParquet")
    assert plugin not in sys.modules  # registering imports nothing
    assert "counting-parquet" in tdu.available_formats()
    loader = tdu.create_dataloader(
        str(data), format="counting-parquet", format_options={"tag": "t"}, batch_size=7
    )
    assert read_ids(loader) == Counter(range(100))
    fmt = loader.dataset.format
    assert type(fmt).__module__ == plugin and fmt.tag == "t"  # type: ignore[attr-defined]
    assert type(fmt).reads > 0  # type: ignore[attr-defined]  # the rows came through it
    assert type(tdu.get_format("COUNTING-PARQUET")) is type(fmt)


def test_a_format_class_can_be_registered_too(data: Path) -> None:
    tdu.register_format("pq2", ParquetFormat)
    loader = tdu.create_dataloader(str(data), format="pq2", batch_size=16)
    assert read_ids(loader) == Counter(range(100))


def test_a_taken_name_needs_clobber(plugin: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"'parquet' is registered already.*clobber"):
        tdu.register_format("parquet", f"{plugin}:CountingParquet")
    with pytest.raises(InvalidArgumentError, match="registered already"):
        tdu.register_format("pq", f"{plugin}:CountingParquet")  # an alias is taken too
    tdu.register_format("mine", f"{plugin}:CountingParquet")
    tdu.register_format("mine", f"{plugin}:CountingParquet")  # the same again: fine
    tdu.register_format("pq", f"{plugin}:CountingParquet", clobber=True)
    assert type(tdu.get_format("pq")).__name__ == "CountingParquet"
    assert type(tdu.get_format("parquet")) is ParquetFormat  # the alias only was replaced


@pytest.mark.parametrize("target", ["module.Class", "module:", ":Class", "a:b:c", 3, dict])
def test_a_target_must_be_module_colon_class_or_a_format_class(target: object) -> None:
    with pytest.raises(InvalidArgumentError, match="target must be"):
        tdu.register_format("bad", target)  # type: ignore[arg-type]


def test_a_target_that_does_not_load_is_an_unknown_format(plugin: str) -> None:
    tdu.register_format("gone", "tdu_no_such_module_anywhere:Format")
    with pytest.raises(UnknownFormatError, match=r"'gone' is registered as .*cannot be loaded"):
        tdu.get_format("gone")
    tdu.register_format("not-a-class", f"{plugin}:Missing")
    with pytest.raises(UnknownFormatError, match="cannot be loaded"):
        tdu.get_format("not-a-class")
    tdu.register_format("not-a-format", f"{plugin}:NOT_A_FORMAT")
    with pytest.raises(UnknownFormatError, match="not a Format subclass"):
        tdu.get_format("not-a-format")


def write_distribution(site: Path, module: str, entries: dict[str, str]) -> None:
    """Installed-package metadata declaring ``entries`` in our entry-point group."""
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


def test_installed_entry_points_are_read_lazily_and_never_replace_a_format(
    plugin: str, data: Path, tmp_path: Path
) -> None:
    target = f"{plugin}:CountingParquet"
    write_distribution(tmp_path / "site", plugin, {"counting": target, "parquet": target})
    tdu.get_format("parquet")  # a known name reads no metadata
    assert not registry._entry_points_read
    with pytest.warns(tdu.TorchDataloaderUtilsWarning) as warned:
        loader = tdu.create_dataloader(str(data), format="counting", batch_size=10)
    assert registry._entry_points_read and plugin in sys.modules
    assert read_ids(loader) == Counter(range(100))
    assert type(loader.dataset.format).__name__ == "CountingParquet"
    assert type(tdu.get_format("parquet")) is ParquetFormat  # the built-in stays
    (warning,) = [str(w.message) for w in warned]
    assert "'parquet'" in warning and "ignored" in warning
    with pytest.raises(InvalidArgumentError, match="registered already"):
        tdu.register_format("counting", ParquetFormat)  # an installed plug-in's name is taken


def test_an_unknown_name_lists_the_installed_plug_ins(plugin: str, tmp_path: Path) -> None:
    write_distribution(tmp_path / "site", plugin, {"counting": f"{plugin}:CountingParquet"})
    with pytest.raises(UnknownFormatError, match=r"available formats: counting, csv, ipc"):
        tdu.get_format("nope")
