"""The whole exception hierarchy of torch-dataloader-utils.

Every error raised by the library derives from `TorchDataloaderUtilsError` and also from the
nearest builtin, so ``except FileNotFoundError`` or ``except ValueError`` keep working in user code.
Each class takes a single message argument: the DataLoader re-raises worker exceptions in the main
process by calling ``type(exc)(message)``, so the type survives the trip from a worker.

What a user must act on but that does not stop the read is a `TorchDataloaderUtilsWarning`, sent
through `warnings.warn` (which Python prints by default); progress goes to logging.
"""

from __future__ import annotations

__all__ = [
    "ColumnNotFoundError",
    "CorruptFileError",
    "DataError",
    "FileChangedError",
    "FilterTypeError",
    "InvalidArgumentError",
    "InvalidSourceError",
    "MissingComponentError",
    "MissingDependencyError",
    "NullValueError",
    "PlanTimeoutError",
    "SchemaMismatchError",
    "StateMismatchError",
    "StorageError",
    "StorageNotFoundError",
    "StoragePermissionError",
    "TorchDataloaderUtilsError",
    "TorchDataloaderUtilsWarning",
    "UnknownFormatError",
    "UnknownKeywordError",
    "UnsupportedFileError",
    "UnsupportedTableError",
    "UnsupportedTypeError",
    "WorkerDiedError",
]


class TorchDataloaderUtilsError(Exception):
    """Root of every error raised by torch-dataloader-utils."""


# --- configuration: raised in the main process, before any worker starts -----------------------


class InvalidArgumentError(TorchDataloaderUtilsError, ValueError):
    """An argument has a value the library cannot work with."""


class UnknownFormatError(InvalidArgumentError):
    """The ``format`` names no registered format."""


class UnknownKeywordError(InvalidArgumentError, TypeError):
    """A keyword argument (or a format option) that the callee does not take; the message
    names the closest valid one. Also a `TypeError`, what Python raises for an unexpected
    keyword, so code written against the earlier library keeps catching it."""


class ColumnNotFoundError(InvalidArgumentError):
    """A requested column (in ``columns`` or ``filters``) is not in the data."""


class InvalidSourceError(InvalidArgumentError):
    """The source (path, glob, list) is malformed: duplicates, nothing matched, bad pattern."""


class UnsupportedTableError(InvalidSourceError):
    """The table holds something this library cannot read correctly (equality deletes, ORC or
    Avro data files, deletion vectors) or the read asked for is not one it does (an incremental
    read over snapshots that are not appends). The message says what to do instead."""


class MissingDependencyError(TorchDataloaderUtilsError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""


class FilterTypeError(TorchDataloaderUtilsError, TypeError):
    """``filters`` is not a ``pyarrow.compute.Expression``."""


class UnsupportedTypeError(TorchDataloaderUtilsError, TypeError):
    """A column's Arrow type has no mapping to the requested output format."""


class StateMismatchError(InvalidArgumentError):
    """A loader state cannot resume this loader: another version, other data, or a layout that
    cannot be resumed elastically. The message says what differs."""


# --- storage ---------------------------------------------------------------------------------


class StorageError(TorchDataloaderUtilsError, OSError):
    """Reading from a filesystem or object store failed."""


class StorageNotFoundError(StorageError, FileNotFoundError):
    """A path, file or bucket does not exist."""


class StoragePermissionError(StorageError, PermissionError):
    """The credentials given may not read a path."""


# --- data ------------------------------------------------------------------------------------


class DataError(TorchDataloaderUtilsError, ValueError):
    """The data itself is bad; the message names the file and range."""


class CorruptFileError(DataError):
    """A file is truncated, corrupt, or not in the format it claims."""


class FileChangedError(DataError):
    """A file changed after it was planned (its size, ETag, generation or modification time
    differ): its rows are not the ones the plan counted. Create the loader again."""


class UnsupportedFileError(DataError):
    """A well-formed file uses something this library does not read (encryption, duplicate
    column names, a whole-shard compression); raised at planning, naming the file, what it uses
    and what to do instead."""


class SchemaMismatchError(DataError):
    """Files of one source disagree on the schema of the columns read."""


class MissingComponentError(DataError):
    """A WebDataset sample lacks a component a column asks for (``missing_component="error"``)."""


class NullValueError(DataError):
    """A column holds nulls and the null policy is ``"error"``."""


# --- ranks -----------------------------------------------------------------------------------


class PlanTimeoutError(TorchDataloaderUtilsError, TimeoutError):
    """A rank waited longer than ``TDU_PLAN_TIMEOUT`` seconds (six hours by default) for rank 0
    to plan the source (``torch.distributed``: rank 0 plans, the other ranks wait for its
    plan)."""


# --- workers ---------------------------------------------------------------------------------


class WorkerDiedError(TorchDataloaderUtilsError, RuntimeError):
    """A DataLoader worker process died (killed by the OS, e.g. the out-of-memory killer's
    ``SIGKILL``, or exited): its batches are lost and the pass stops. The message names the
    worker, its pid and the signal. The loader has already stopped its other workers: call
    ``loader.load_state_dict(state)`` with the state saved after the last batch you received
    (``loader.state_dict()`` taken after the error resumes there too) and iterate again to
    finish the epoch with new workers, every row once."""


# --- warnings ----------------------------------------------------------------------------------


class TorchDataloaderUtilsWarning(UserWarning):
    """A warning of torch-dataloader-utils: something the user should act on (a shard index
    that cannot be cached, a cache that cannot be written, ...) while the read goes on. Filter
    them as one: ``warnings.filterwarnings("ignore", category=TorchDataloaderUtilsWarning)``."""
