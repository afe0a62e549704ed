"""Wrappers around a loader (`state.wrappers`): a wrapper that copies the loader's ``__dict__``
forwards its methods (`Forwarded`), the loader's own method wins (`kept`), and a reader known to
hold a batch ahead is recognized and its batch counted (`Reader`); with Ray Train itself:
tests/trainers/test_ray_wrapper.py."""

from __future__ import annotations

import gc
import pickle
import sys
from typing import Any

import pytest

from torch_dataloader_utils.errors import TorchDataloaderUtilsWarning
from torch_dataloader_utils.state.wrappers import Forwarded, Reader, kept


class Loader:
    def __init__(self, name: str) -> None:
        self.name = name
        self.__dict__.update(Forwarded.methods(self, "state_dict"))

    @kept
    def state_dict(self) -> dict[str, Any]:
        """The loader's state."""
        return {"name": self.name}


class Copy:
    """What Ray Train's wrapper does: the loader's attributes, not its methods."""

    def __init__(self, loader: Loader) -> None:
        self.__dict__.update(loader.__dict__)


def test_a_copy_of_the_attributes_forwards_the_method_and_the_loaders_own_wins() -> None:
    loader = Loader("a")
    assert isinstance(loader.__dict__["state_dict"], Forwarded)
    assert loader.state_dict.__self__ is loader  # (the method, not the forwarding attribute)
    assert Loader.state_dict.__doc__ == "The loader's state."
    assert Copy(loader).state_dict() == {"name": "a"}


def test_a_forwarded_method_holds_its_loader_weakly_and_pickles_with_it() -> None:
    loader = Loader("b")
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.state_dict() == {"name": "b"}
    assert Copy(copy).state_dict() == {"name": "b"}
    forwarded = Copy(loader).state_dict
    del loader
    gc.collect()
    with pytest.raises(ReferenceError, match="the loader of this state_dict is gone"):
        forwarded()


def fake_ray_reader(**attributes: Any) -> Any:
    """An object of the class Ray Train's look-ahead wrapper has, by module and name."""
    kind = type("_WrappedDataLoader", (), {"__module__": "ray.train.torch.train_loop_utils"})
    reader = kind()
    reader.__dict__.update(attributes)
    return reader


class Iterator:
    pass


def called_by(reader: Any, loader: Any, iterator: Any) -> Reader | None:
    """`Reader.of` as the loader's ``__iter__`` calls it, from a method of ``reader``."""
    self = reader  # noqa: F841 (what the caller's frame holds)
    return Reader.of(loader, sys._getframe(), iterator)


def test_a_known_reader_is_recognized_and_its_batch_ahead_counted() -> None:
    loader, iterator = Loader("c"), Iterator()
    reader = fake_ray_reader(_dataloader=loader, next_batch=None, dataloader_iter=iterator)
    found = called_by(reader, loader, iterator)
    assert found is not None and found.held() == 0
    reader.next_batch = {"x": 1}
    assert found.held() == 1
    reader.dataloader_iter = Iterator()  # it reads another pass now
    assert found.held() == 0
    assert pickle.loads(pickle.dumps(found)) is None
    assert called_by(object(), loader, iterator) is None  # not a look-ahead reader


def test_a_known_reader_that_changed_is_warned_about() -> None:
    loader = Loader("d")
    with pytest.warns(TorchDataloaderUtilsWarning, match="move_to_device=False"):
        assert called_by(fake_ray_reader(_dataloader=loader), loader, Iterator()) is None
