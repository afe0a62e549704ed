"""Wrappers around a loader: the batch one holds ahead, and the methods one copies.

Ray Train's ``prepare_data_loader(loader)`` (its default, ``move_to_device=True``) returns a
``_WrappedDataLoader`` that always holds the next batch: when the user has received batch n,
the loader has produced n + 1, and a state taken then resumed one batch late (a batch lost per
rank). The wrapper is recognized when it starts a pass (`Reader.of`) and the batch it holds is
counted back out of the state (`Reader.held`). ADR 0018.

The same wrapper copies the loader's attributes (``__dict__``), not its methods: a
`Forwarded` method kept among the attributes makes ``wrapped.state_dict()`` (and
``load_state_dict``, ``set_epoch``) the loader's own. On the loader itself the method is a
`kept` one, which wins over the attribute, so ``make_loader().load_state_dict(s)`` keeps its
loader alive through the call as any bound method does.

Lightning prefetches only from loaders without a length (ours has one), and torchdata's
``StatefulDataLoader`` snapshots its workers' states batch by batch: neither holds a batch the
state counts. HF Accelerate's ``GradientState`` is told which batch is a pass's last
(`tracked`).
"""

from __future__ import annotations

import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from ..errors import TorchDataloaderUtilsWarning

__all__ = ["Forwarded", "Reader", "gradient_state", "kept", "tracked"]

# Readers known to hold one batch ahead, by module and class: what they hold is read from
# their attributes (`Reader.held`).
_KNOWN = {("ray.train.torch.train_loop_utils", "_WrappedDataLoader")}


class Reader:
    """The look-ahead reader iterating one pass of a loader, if any (weakly held: never keeps
    the reader, its iterator or the loader's workers alive)."""

    def __init__(self, reader: Any, iterator: Any) -> None:
        self._reader = weakref.ref(reader)
        self._iterator = weakref.ref(iterator)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_no_reader, ())  # a loader pickled mid-pass: its copy has no reader

    @classmethod
    def of(cls, loader: Any, caller: FrameType | None, iterator: Any) -> Reader | None:
        """The look-ahead reader that called ``loader.__iter__`` from ``caller`` (its frame) and
        got ``iterator``; None when the caller is not one."""
        reader = caller.f_locals.get("self") if caller is not None else None
        kind = type(reader)
        if (kind.__module__, kind.__name__) not in _KNOWN:
            return None
        if getattr(reader, "_dataloader", None) is not loader or not hasattr(reader, "next_batch"):
            warnings.warn(
                f"{kind.__module__}.{kind.__name__} wraps this loader but no longer has the "
                "attributes read to find the batch it holds ahead: a state taken now may "
                "resume one batch late. Pass move_to_device=False to prepare_data_loader",
                TorchDataloaderUtilsWarning,
                stacklevel=3,
            )
            return None
        return cls(reader, iterator)

    def held(self) -> int:
        """Batches the reader holds that its user has not received (0 or 1)."""
        reader, iterator = self._reader(), self._iterator()
        if reader is None or iterator is None:
            return 0
        if getattr(reader, "dataloader_iter", None) is not iterator:
            return 0  # it reads another pass now (or none)
        return 0 if getattr(reader, "next_batch", None) is None else 1


def _no_reader() -> None:
    return None


class Forwarded:
    """Method ``name`` of a loader, kept in its ``__dict__`` so that wrappers that copy it
    (Ray Train's) forward the call. It refers to the loader weakly (no reference cycle: the
    loader and its workers go when the program drops it) and pickles as (loader, name)."""

    __slots__ = ("_loader", "name")

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = weakref.ref(loader)
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        loader = self._loader()
        if loader is None:
            raise ReferenceError(f"the loader of this {self.name} is gone")
        return getattr(type(loader), self.name)(loader, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Forwarded, (self._loader(), self.name))

    @classmethod
    def methods(cls, loader: Any, *names: str) -> dict[str, Forwarded]:
        """``names`` of ``loader`` forwarded, for its ``__dict__``."""
        return {name: cls(loader, name) for name in names}


class kept:  # noqa: N801 - used as a decorator, like property
    """A method that wins over an instance attribute of its name (a data descriptor): the
    loader's own ``state_dict`` is its method, while its ``__dict__`` holds the `Forwarded`
    one that wrappers copy."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.name = function.__name__
        self.__doc__ = function.__doc__  # (what help() and the API reference show)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.function
        return types.MethodType(self.function, instance)

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[self.name] = value


_END = object()


def gradient_state() -> Any:
    """Accelerate's ``GradientState`` (imported only for a loader given an accelerator)."""
    from accelerate.state import GradientState

    return GradientState()


def tracked(loader: Any, batches: Iterator[Any], state: Any) -> Iterator[Any]:
    """``batches``, telling accelerate's GradientState ``state`` when the last comes (one
    batch look-ahead; ``loader.end_of_dataloader`` as accelerate's own loaders set it)."""
    loader.end_of_dataloader, loader.remainder = False, -1
    state._add_dataloader(loader)
    try:
        current = next(batches, _END)
        while current is not _END:
            following = next(batches, _END)
            loader.end_of_dataloader = following is _END
            yield current
            current = following
    finally:
        state._remove_dataloader(loader)
