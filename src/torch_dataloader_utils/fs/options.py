"""Storage options, and layering them: options found for a source (an Iceberg table's FileIO
properties) under the user's explicit ones, key by key (`FileSystemSpec.under`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MergedOptions", "StorageOptions", "merge_options"]

# Storage options, or a function that returns them: called in each process that touches the
# storage (each DataLoader worker too), so short-lived credentials are fetched where they are
# used rather than frozen into a pickle.
StorageOptions = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge(old, value)  # client_kwargs, config_kwargs: key by key
        else:
            merged[key] = value
    return merged


def _resolve(options: StorageOptions) -> Mapping[str, Any]:
    return options() if callable(options) else options


class MergedOptions:
    """Storage options: ``base`` under ``user``, either of them a function (called per
    process, each time these are: `FileSystemSpec` calls them once per process, and again
    when the storage refuses them).

    Picklable (each DataLoader worker calls it again); its repr shows no values.
    """

    def __init__(self, base: StorageOptions, user: StorageOptions) -> None:
        self._base = base if callable(base) else dict(base)
        self._user = user if callable(user) else dict(user)

    def __call__(self) -> dict[str, Any]:
        return _merge(_resolve(self._base), _resolve(self._user))

    def __repr__(self) -> str:
        def shown(options: StorageOptions) -> str:
            return repr(options) if callable(options) else f"<{', '.join(sorted(options))}>"

        return f"MergedOptions({shown(self._base)}, {shown(self._user)})"


def merge_options(base: StorageOptions, user: StorageOptions | None) -> StorageOptions:
    """``base`` options under the user's explicit ones (a mapping or a function): a mapping
    when both are, else a `MergedOptions` that merges them when called."""
    if user is None or (not callable(user) and not user):
        return base if callable(base) else dict(base)
    if callable(base) or callable(user):
        return MergedOptions(base, user)
    return _merge(base, user)
