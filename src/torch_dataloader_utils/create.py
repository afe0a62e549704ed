"""`create_dataloader`: the dataset the data asks for (files, a table, a mixture) and the
`TabularDataLoader` over it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import torch

from .dataset import MixtureDataset, PlannedDataset, StructuredDataset
from .dataset.measure import batches_here
from .errors import InvalidArgumentError
from .formats import Format
from .fs import Paths
from .loader import DEFAULT_BUNDLE_ROWS, TabularDataLoader
from .metrics.workers import choose_workers, cores_per_rank
from .options import LoaderOptions, Source
from .state import Readable

__all__ = ["create_dataloader"]

logger = logging.getLogger("torch_dataloader_utils")

_D = TypeVar("_D", bound=Readable)


def create_dataloader(
    source: Paths | Source | Sequence[Source] | None = None,
    *,
    path: Paths | None = None,
    format: str | Format = "parquet",
    num_workers: int | str | None = None,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    multiprocessing_context: Any = None,
    timeout: float = 0,
    worker_init_fn: Callable[[int], None] | None = None,
    bundle_rows: int = DEFAULT_BUNDLE_ROWS,
    device: torch.device | str | None = None,
    accelerator: Any = None,
    dataset_class: type[StructuredDataset] = StructuredDataset,
    **dataset_options: Any,
) -> TabularDataLoader[PlannedDataset]:
    """Build a dataset over ``source`` and a DataLoader that reads it.

    Args:
        source: a path or URL, directory, glob, brace pattern, or a list of them; or a
            `Source`, or a list of them: a mixture (`MixtureDataset`).
        path: the same as ``source``, under the name the earlier library used.
        format: format name (``"parquet"``) or a `Format` instance.
        num_workers: worker processes (default: ``min(4, cpu_count)``; 0 reads in-process;
            ``"auto"``: chosen from the cores, the ranks on the machine and a short measurement
            of the data, logged at INFO with the reason).
        pin_memory: pin batches for fast host→GPU copies.
        persistent_workers: keep workers alive between epochs (``set_epoch`` still reaches
            them).
        prefetch_factor: messages each worker keeps ready (default 2).
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or a context.
        timeout: seconds to wait for a worker's batch (0: forever).
        worker_init_fn: called in each worker with its id.
        bundle_rows: rows per worker→main message (0: one batch per message). The batches and
            their order are the same either way.
        device: hand each batch's tensors on this device, copied one batch ahead. On CUDA a
            batch of 4 MiB or more is copied on a side stream while the step before it runs,
            a smaller one on the step's own stream (pair with ``pin_memory=True``, so the copy
            is a DMA that takes no CPU).
        accelerator: an ``accelerate.Accelerator``: batches go to its device, and its gradient
            accumulation sees the last batch of each epoch. Pass the loader through
            ``accelerator.prepare()`` as usual; it comes back unchanged (each rank already
            reads only its share).
        dataset_class: the dataset class to build.
        **dataset_options: everything `StructuredDataset` accepts (``batch_size``,
            ``columns``, ``filters``, ``shuffle``, ``shuffle_seed``, ``drop_last``,
            ``output_format``, ``storage_options``, ``partitioning``, ...), and
            ``packing=tdu.Packing(...)`` (a token-list column packed into sequences) or
            ``batching=tdu.TokenBudget(...)`` (batches of whole rows under a token budget,
            instead of ``batch_size``): see docs/concepts/packing.md.

    Returns:
        The loader; ``loader.dataset`` is the dataset. Call ``loader.set_epoch(epoch)`` before
        each epoch.

    Raises:
        InvalidArgumentError: an option is out of range.
        UnknownFormatError: ``format`` is not registered.
        StorageNotFoundError: ``source`` does not exist.
        ColumnNotFoundError: a column in ``columns`` or ``filters`` is not in the data.
        FilterTypeError: ``filters`` is not a ``pyarrow.compute.Expression``.
        CorruptFileError: a file cannot be parsed.
        SchemaMismatchError: files disagree on the schema of the columns read.

    Examples:
        >>> import torch_dataloader_utils as tdu  # doctest: +SKIP
        >>> loader = tdu.create_dataloader("data/*.parquet", batch_size=1024, shuffle=True)
        >>> for epoch in range(2):
        ...     loader.set_epoch(epoch)
        ...     for batch in loader:
        ...         ...
    """
    loading = LoaderOptions(
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        multiprocessing_context=multiprocessing_context,
        timeout=timeout,
        worker_init_fn=worker_init_fn,
        bundle_rows=bundle_rows,
        device=device,
        accelerator=accelerator,
    )
    data = source if source is not None else path
    if data is None or (source is not None and path is not None):
        raise InvalidArgumentError("pass the data as source (or path=), exactly once")
    if isinstance(data, Source) or (
        isinstance(data, list | tuple) and data and all(isinstance(s, Source) for s in data)
    ):
        if dataset_class is not StructuredDataset:
            raise InvalidArgumentError("a mixture of tdu.Source is read by MixtureDataset")
        if format != "parquet":
            raise InvalidArgumentError(
                f"format={format!r} with a list of tdu.Source: give each Source its own format="
            )
        sources = [data] if isinstance(data, Source) else list(data)
        return _loader(loading, MixtureDataset(sources, **dataset_options))
    return _loader(loading, dataset_class(cast(Paths, data), format, **dataset_options))


def _loader(loading: LoaderOptions, dataset: _D) -> TabularDataLoader[_D]:
    """The loader of ``dataset``; ``num_workers="auto"`` decided now, from a short measurement
    of its batches (logged once at INFO with the reason)."""
    if loading.num_workers == "auto":
        cores, local = cores_per_rank()
        made = batches_here(dataset) if isinstance(dataset, PlannedDataset) else None
        count, why = choose_workers(made, cores=cores, local=local)
        logger.info("num_workers='auto': %d (%s)", count, why)
        loading = dataclasses.replace(loading, num_workers=count)
        if not count:
            loading = dataclasses.replace(loading, persistent_workers=False)
    return loading.loader(dataset)
