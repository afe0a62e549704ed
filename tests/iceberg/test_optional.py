"""pyiceberg is optional: the package and ``IcebergDataset`` import without it, and using it
says which extra to install."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest

from torch_dataloader_utils import InvalidArgumentError
from torch_dataloader_utils.formats import Listing
from torch_dataloader_utils.iceberg.format import IcebergFormat

pytestmark = pytest.mark.timeout(60)


def test_import_without_pyiceberg_and_the_error_naming_the_extra() -> None:
    script = textwrap.dedent(
        """
        import sys
        import torch_dataloader_utils as tdu
        from torch_dataloader_utils import IcebergDataset
        from torch_dataloader_utils.iceberg import MissingDependencyError
        assert not [m for m in sys.modules if m.startswith("pyiceberg")], "pyiceberg imported"
        sys.modules["pyiceberg"] = None  # as if it were not installed
        try:
            IcebergDataset.create_dataloader(table="db.t", catalog_config={})
        except MissingDependencyError as exc:
            assert isinstance(exc, ImportError) and isinstance(exc, tdu.TorchDataloaderUtilsError)
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "torch-dataloader-utils[iceberg]"' in done.stdout


def test_the_format_plans_nothing_itself_and_pickles() -> None:
    fmt = IcebergFormat()
    with pytest.raises(InvalidArgumentError, match="IcebergDataset"):
        fmt.plan(Listing.of([]), None, None)  # type: ignore[arg-type]
    assert type(pickle.loads(pickle.dumps(fmt))) is IcebergFormat
