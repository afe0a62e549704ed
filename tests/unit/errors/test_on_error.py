"""The ``on_error`` policy's parts (`errors.on_error`): what is skippable, a failure's line, the
failures of a process drained in order (logged once, or relayed to the main process), and the
rows that take the places of skipped ones; the policy through real workers:
tests/multiproc/test_on_error.py."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from torch_dataloader_utils.errors import (
    CorruptFileError,
    FileChangedError,
    InvalidArgumentError,
    StorageError,
)
from torch_dataloader_utils.errors.on_error import SKIPPABLE, FailureLog, ReadFailure, fill_rows

FAILURE = ReadFailure("s3://b/a.parquet", "chunk 3, rows 0-99", 100, "CorruptFileError", "bad")


def test_bad_data_and_failed_storage_are_skippable_and_mistakes_are_not() -> None:
    for error in (CorruptFileError("x"), FileChangedError("x"), StorageError("x")):
        assert isinstance(error, SKIPPABLE)
    assert not isinstance(InvalidArgumentError("x"), SKIPPABLE)
    assert not isinstance(ValueError("x"), SKIPPABLE)


def test_a_failure_says_where_how_many_and_why() -> None:
    assert str(FAILURE) == (
        "s3://b/a.parquet (chunk 3, rows 0-99): 100 rows skipped: CorruptFileError: bad"
    )


@pytest.mark.parametrize("relayed", [False, True])
def test_failures_drain_in_order_logged_here_unless_relayed(
    relayed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    log = FailureLog()
    log.relayed = relayed
    second = ReadFailure("", "chunk 4", 5, "StorageError", "gone")
    with caplog.at_level(logging.WARNING, logger="torch_dataloader_utils"):
        log.add(FAILURE)
        log.add(second)
    assert log.drain() == (FAILURE, second)
    assert log.drain() == ()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == (
        [] if relayed else [f"on_error='skip': {FAILURE}", f"on_error='skip': {second}"]
    )


def test_skipped_rows_are_copies_of_the_last_rows_read_cycling() -> None:
    donor = pa.record_batch({"id": [10, 11, 12]})
    assert fill_rows(donor, 2).column("id").to_pylist() == [11, 12]
    assert fill_rows(donor, 3).column("id").to_pylist() == [10, 11, 12]
    assert fill_rows(donor, 5).column("id").to_pylist() == [10, 11, 12, 10, 11]
    assert fill_rows(donor, 0).num_rows == 0
