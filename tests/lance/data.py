"""Lance datasets the Lance tests read, written by pylance itself: several fragments, appends
(versions), deletion files, an overwrite. Row values are functions of ``id`` (`make_table`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from tests.conftest import make_table

# Version 1: 300 rows in fragments of 70 (70, 70, 70, 70, 20); version 2: 100 rows appended
# (fragments of 70, 30); version 3: every id % 7 == 0 deleted (deletion files in every
# fragment); version 4: ids 280-299 deleted (the whole 20-row fragment: it leaves the manifest).
FIRST, APPENDED = range(0, 300), range(300, 400)
ROWS_PER_FILE = 70


def live_ids(version: int) -> list[int]:
    """The ids of the rows of `write_dataset`'s ``version``."""
    ids = list(FIRST) if version == 1 else [*FIRST, *APPENDED]
    if version >= 3:
        ids = [i for i in ids if i % 7]
    if version >= 4:
        ids = [i for i in ids if not 280 <= i < 300]
    return ids


def write_dataset(uri: Path, versions: int = 4) -> str:
    """The dataset at ``uri`` at versions 1 to ``versions`` (see the module's constants)."""
    import lance

    rows = make_table(np.asarray(FIRST))
    lance.write_dataset(rows, str(uri), max_rows_per_file=ROWS_PER_FILE, max_rows_per_group=32)
    steps = [
        lambda ds: lance.write_dataset(
            make_table(np.asarray(APPENDED)), str(uri), mode="append", max_rows_per_file=70
        ),
        lambda ds: ds.delete("id % 7 = 0"),
        lambda ds: ds.delete("id >= 280 AND id < 300"),
    ]
    for step in steps[: versions - 1]:
        step(lance.dataset(str(uri)))
    return str(uri)


def append(uri: str, ids: range) -> None:
    """A new version: ``ids`` appended."""
    import lance

    lance.write_dataset(make_table(np.asarray(ids)), uri, mode="append")


def overwrite(uri: str, ids: range) -> None:
    """A new version holding ``ids`` alone."""
    import lance

    lance.write_dataset(make_table(np.asarray(ids)), uri, mode="overwrite")


def oracle(uri: str, version: int | None = None) -> pa.Table:
    """The dataset's rows at ``version`` as pylance reads them."""
    import lance

    return lance.dataset(uri, version=version).to_table()
