"""The exception hierarchy (docs/concepts/errors.md): one root, builtin bases, rebuildable."""

from __future__ import annotations

import inspect
import pickle

import pytest

import torch_dataloader_utils
from torch_dataloader_utils import errors
from torch_dataloader_utils.errors import TorchDataloaderUtilsError

# The builtin each class must also be, so ``except <builtin>`` keeps working in user code.
BUILTIN_BASES: dict[str, type[BaseException]] = {
    "TorchDataloaderUtilsError": Exception,
    "InvalidArgumentError": ValueError,
    "UnknownFormatError": ValueError,
    "ColumnNotFoundError": ValueError,
    "InvalidSourceError": ValueError,
    "FilterTypeError": TypeError,
    "UnsupportedTypeError": TypeError,
    "StorageError": OSError,
    "StorageNotFoundError": FileNotFoundError,
    "StoragePermissionError": PermissionError,
    "DataError": ValueError,
    "CorruptFileError": ValueError,
    "SchemaMismatchError": ValueError,
    "StateMismatchError": ValueError,
    "NullValueError": ValueError,
    "UnsupportedTableError": ValueError,
    "UnsupportedFileError": ValueError,
    "MissingDependencyError": ImportError,
    "MissingComponentError": ValueError,
    "FileChangedError": ValueError,
    "WorkerDiedError": RuntimeError,
    "PlanTimeoutError": TimeoutError,
    "UnknownKeywordError": TypeError,  # what Python raises for an unexpected keyword
}

# Narrower library bases a class must keep (a caller catching the broader one sees it).
LIBRARY_BASES: dict[str, str] = {
    "UnknownFormatError": "InvalidArgumentError",
    "ColumnNotFoundError": "InvalidArgumentError",
    "InvalidSourceError": "InvalidArgumentError",
    "StorageNotFoundError": "StorageError",
    "StoragePermissionError": "StorageError",
    "CorruptFileError": "DataError",
    "SchemaMismatchError": "DataError",
    "StateMismatchError": "InvalidArgumentError",
    "NullValueError": "DataError",
    "UnsupportedTableError": "InvalidSourceError",
    "UnsupportedFileError": "DataError",
    "MissingComponentError": "DataError",
    "FileChangedError": "DataError",
    "UnknownKeywordError": "InvalidArgumentError",
}

# The warning classes errors.py also holds (sent with warnings.warn, never raised).
WARNINGS = {"TorchDataloaderUtilsWarning"}
ERRORS = sorted(set(errors.__all__) - WARNINGS)


def error_classes() -> list[type[BaseException]]:
    return [getattr(errors, name) for name in ERRORS]


def test_all_is_sorted_and_lists_every_exception_class() -> None:
    assert errors.__all__ == sorted(errors.__all__)
    defined = {
        name
        for name, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }
    assert defined == set(errors.__all__)


def test_every_class_derives_from_the_root() -> None:
    for cls in error_classes():
        assert issubclass(cls, TorchDataloaderUtilsError), cls


def test_builtin_bases() -> None:
    assert set(BUILTIN_BASES) == set(ERRORS)
    for name, builtin in BUILTIN_BASES.items():
        cls = getattr(errors, name)
        assert issubclass(cls, builtin), (name, builtin)


def test_library_bases() -> None:
    for name, base in LIBRARY_BASES.items():
        assert issubclass(getattr(errors, name), getattr(errors, base)), (name, base)


def test_every_class_is_exported_from_the_package() -> None:
    for name in errors.__all__:
        assert getattr(torch_dataloader_utils, name) is getattr(errors, name)
        assert name in torch_dataloader_utils.__all__


@pytest.mark.parametrize("name", ERRORS)
def test_rebuilt_from_type_and_message(name: str) -> None:
    # The DataLoader re-raises a worker's exception in the main process as type(e)(str(e)).
    cls = getattr(errors, name)
    message = "s3://bucket/part-007.parquet row group 3 (rows 0:100): boom"
    original = cls(message)
    rebuilt = type(original)(str(original))
    assert type(rebuilt) is cls
    assert str(rebuilt) == message
    # Rebuilding again is stable.
    assert str(type(rebuilt)(str(rebuilt))) == message


@pytest.mark.parametrize("name", ERRORS)
def test_pickles(name: str) -> None:
    cls = getattr(errors, name)
    original = cls("the message")
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is cls
    assert str(copy) == "the message"


def test_warnings_are_user_warnings_of_their_own() -> None:
    # Shown by Python's default filters, and filtered as one category by the user.
    for name in WARNINGS:
        cls = getattr(errors, name)
        assert issubclass(cls, UserWarning) and not issubclass(cls, TorchDataloaderUtilsError)


def test_an_unknown_keyword_is_also_a_type_error_and_an_invalid_argument() -> None:
    # The earlier API raised Python's TypeError for it; our root catches it too.
    error = errors.UnknownKeywordError("create_dataloader got an unexpected keyword argument 'x'")
    assert isinstance(error, TypeError)
    assert isinstance(error, errors.InvalidArgumentError)
