"""The keys of a loader state, and reading them strictly.

A state is plain Python values (``torch.save``, JSON). Every key it may hold is named here, once:
the encoder writes these, the decoder reads these, and a state with a key missing, a key this
version does not know, or a value of the wrong kind is refused with `StateMismatchError` saying
which (never a ``KeyError`` or ``TypeError`` from deep inside).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import StateMismatchError

__all__ = [
    "BATCHES",
    "COMPLETE",
    "EPOCH",
    "KIND",
    "LAYOUT",
    "LAYOUT_SAVED_AS",
    "LEGS",
    "LEG_KEYS",
    "LOADER_KEYS",
    "LOADER_OPTIONAL",
    "NUM_WORKERS",
    "PLAN",
    "PLAN_KEYS",
    "PLAN_OPTIONAL",
    "READ_FAILURES",
    "READ_FAILURE_KEYS",
    "STREAM_BATCHES",
    "STEPS",
    "STREAM_KEYS",
    "TOPOLOGY",
    "TOPOLOGY_KEYS",
    "VERSION",
    "WORKER",
    "WORLD_SIZE",
    "checked",
]

KIND = "kind"
VERSION = "version"
EPOCH = "epoch"
BATCHES = "batches"  # batches this rank delivered in the current leg
COMPLETE = "complete"  # the epoch was delivered whole
TOPOLOGY = "topology"
LAYOUT = "layout"
# Layout fields a state holds under another key: renamed in Python after states were saved
# with the earlier name, which states keep (so both old and new states resume).
LAYOUT_SAVED_AS = {"seq_tokens": "unit"}
LEGS = "legs"  # earlier legs of this epoch (elastic resumes)
PLAN = "plan"  # facts of the plan it was saved for
READ_FAILURES = "read_failures"  # reads skipped under on_error="skip" (the loader's)
SKIPS = "skips"  # batches not to deliver: {epoch: [[first, stop], ...]} (loader.skip)
STEPS = "steps"  # [world_size, batch_size] a mixture's weights schedule counts steps in
WORKER = "worker"  # a stream state's worker
STREAM_BATCHES = "stream_batches"  # batches that worker's stream delivered
WORLD_SIZE = "world_size"
NUM_WORKERS = "num_workers"

TOPOLOGY_KEYS = frozenset({WORLD_SIZE, NUM_WORKERS})
LEG_KEYS = frozenset({WORLD_SIZE, NUM_WORKERS, LAYOUT, BATCHES})
LEG_OPTIONAL = frozenset({SKIPS})
# "file_versions", "snapshot_id", "version", "commit", "tokenizer" and "transform" are optional
# (states saved before files were pinned; tables: Iceberg, Delta or Lance; files at a Hugging Face
# Hub commit; sources tokenized or transformed in the loader).
PLAN_KEYS = frozenset({"fingerprint", "rows", "chunks", "files"})
PLAN_OPTIONAL = frozenset(
    {"file_versions", "snapshot_id", "version", "commit", "tokenizer", "transform", "balance"}
)
READ_FAILURE_KEYS = frozenset({"failures", "rows"})
LOADER_KEYS = frozenset({KIND, VERSION, EPOCH, BATCHES, COMPLETE, TOPOLOGY, LAYOUT, LEGS, PLAN})
LOADER_OPTIONAL = frozenset({READ_FAILURES, SKIPS, STEPS})
STREAM_KEYS = LOADER_KEYS | {WORKER, STREAM_BATCHES}


def checked(
    value: Any, keys: Iterable[str], where: str, optional: Iterable[str] = ()
) -> Mapping[str, Any]:
    """``value`` when it is a mapping with exactly ``keys`` (plus any of ``optional``).

    Raises:
        StateMismatchError: it is not a mapping, lacks a key, or has one not listed.
    """
    if not isinstance(value, Mapping):
        raise StateMismatchError(
            f"malformed loader state: {where} is a {type(value).__name__}, not a mapping "
            "(expected the dict that loader.state_dict() returns, unchanged)"
        )
    required = set(keys)
    missing = sorted(required - set(value))
    unknown = sorted(set(value) - required - set(optional))
    if missing or unknown:
        said = [f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else ""]
        raise StateMismatchError(
            f"malformed loader state: {where} has keys {' and '.join(filter(None, said))} "
            "(expected the dict that loader.state_dict() returns, unchanged)"
        )
    return value
