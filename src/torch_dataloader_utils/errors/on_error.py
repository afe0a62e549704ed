"""The ``on_error`` policy: what a read that fails leaves in the stream (docs/adr/0011).

``on_error="raise"`` (the default) raises the library error naming the file and rows.
``on_error="skip"`` is for long jobs that would rather lose a damaged chunk than stop: the rows
that cannot be read are left out, and their places in the stream are taken by copies of rows
read just before them in the same stream. The stream keeps its planned length, so every rank
still gets its planned, equal number of batches (an idle DDP rank hangs the job) and resuming
at a batch stays exact. Each failure is logged once, with the file, the rows and the error, and
counted: nothing is skipped without being counted.

Only bad data and failed storage are skipped (`DataError`, `StorageError`: a corrupt chunk, a
value the output refuses, a file deleted or changed since planning, a store that kept failing
after its retries). A wrong argument or a bug is raised whatever the policy.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa

from . import DataError, StorageError

__all__ = [
    "ON_ERROR",
    "SKIPPABLE",
    "FailureLog",
    "OnError",
    "ReadFailure",
    "fill_rows",
    "log_failure",
]

logger = logging.getLogger("torch_dataloader_utils")

OnError = Literal["raise", "skip"]
ON_ERROR: tuple[str, ...] = ("raise", "skip")

# What `on_error="skip"` skips: the data or its storage, never a bug or a wrong argument.
SKIPPABLE: tuple[type[Exception], ...] = (DataError, StorageError)


@dataclass(frozen=True)
class ReadFailure:
    """Rows that could not be read and were replaced (``on_error="skip"``).

    Attributes:
        file: the file's URL.
        rows: where: the chunk and rows of the piece that failed.
        skipped: how many rows were left out (each replaced by a copy of a row read before).
        error: the error's class name.
        message: the error's message (it names the file and rows too).
    """

    file: str
    rows: str
    skipped: int
    error: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file} ({self.rows})" if self.file else self.rows
        return f"{where}: {self.skipped} rows skipped: {self.error}: {self.message}"


def log_failure(failure: ReadFailure) -> None:
    """Log ``failure``, once, in the process the user watches."""
    logger.warning("on_error='skip': %s", failure)


class FailureLog:
    """The failures of one process, in order; safe to add to from reading threads.

    Attributes:
        relayed: the failures go to the main process with the batches, which logs them
            (a TabularDataLoader's worker); otherwise they are logged here.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new: list[ReadFailure] = []
        self.relayed = False

    def add(self, failure: ReadFailure) -> None:
        """Record ``failure`` (and log it, unless relayed)."""
        if not self.relayed:
            log_failure(failure)
        with self._lock:
            self._new.append(failure)

    def drain(self) -> tuple[ReadFailure, ...]:
        """The failures added since the last drain."""
        with self._lock:
            new, self._new = self._new, []
        return tuple(new)


def fill_rows(donor: pa.RecordBatch, n: int) -> pa.RecordBatch:
    """``n`` rows copied from ``donor`` (its last rows, cycling): the places of skipped rows."""
    count = donor.num_rows
    index = (np.arange(n, dtype=np.int64) + max(0, count - n)) % count
    return donor.take(pa.array(index))
