"""Plans kept in ``cache_dir`` (rank 0's) for a restart to plan from.

A source's planning options and this library's version key a file of its own
(``<cache_dir>/tdu-plans-v1/<key>.pickle``). It holds the plan of the last listing planned;
beside it (``.facts``), for a format planned file by file (`Format.per_file`), each file's
facts by its identity (size and version: ETag, generation or mtime), read only when the
listing changed. A restart whose listing is unchanged takes the plan
as it is: no footer read, no row counted. A changed listing reads the facts of the files
whose identity is new, and only those; a file's old facts are never used for a new identity.
A file that cannot be read or unpickled is planned from scratch (and rewritten).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import pickle
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..fs import ListedFile

__all__ = ["KEPT_FOLDER", "Kept", "KeptPlans", "facts_of", "kept_plans", "listing_digest"]

logger = logging.getLogger(__name__)

KEPT_FOLDER = "tdu-plans-v1"


def _library_version() -> str:
    """This library's installed version (a plan kept by another is not used)."""
    try:
        return importlib.metadata.version("torch-dataloader-utils")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


VERSION = _library_version()
# The form of the plans kept, in their key: a plan kept before plans had one schema on every
# path (`portable_schema`) is not used, whatever the version says.
_PLAN_FORM = 2


def kept_plans(directory: str, *, clear: bool = False) -> int:
    """How many plans ``directory`` keeps (``clear``: removed, and how many were)."""
    folder = os.path.join(directory, KEPT_FOLDER)
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".pickle")]
    except FileNotFoundError:
        return 0
    if clear:
        shutil.rmtree(folder, ignore_errors=True)
    return len(names)


def listing_digest(files: Sequence[ListedFile]) -> str:
    """A digest of a listing: every file's path, size and version, in order."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.path}\0{f.size}\0{f.version}\n".encode())
    return digest.hexdigest()


@dataclass
class Kept:
    """What planning a source left for a restart.

    Attributes:
        listing: the listing's digest (`listing_digest`).
        planned: the source's plan (`files.Planned`).
        facts: each file's facts by path, with the identity they were read at (kept apart:
            read only when the listing changed).
    """

    listing: str
    planned: Any
    facts: dict[str, tuple[int, str, Any]] = field(default_factory=dict)


def facts_of(kept: dict[str, tuple[int, str, Any]], files: Sequence[ListedFile]) -> dict[str, Any]:
    """The ``kept`` facts of those of ``files`` whose identity is unchanged."""
    out = {}
    for f in files:
        old = kept.get(f.path)
        if old is not None and old[:2] == (f.size, f.version):
            out[f.path] = old[2]
    return out


@dataclass(frozen=True)
class KeptPlans:
    """Where one source's plans are kept (``directory``: the cache directory)."""

    directory: str
    key: str

    @classmethod
    def of(cls, directory: str, *options: Any) -> KeptPlans:
        """The store of a source planned with ``options`` (everything that changes its plan:
        the format, the path, the columns, filter, partitioning, splits and counts)."""
        try:
            given = pickle.dumps((VERSION, _PLAN_FORM, *options), protocol=4)
        except Exception:  # (an option that does not pickle: keyed by its text)
            given = repr((VERSION, _PLAN_FORM, *options)).encode()
        return cls(directory, hashlib.sha256(given).hexdigest()[:32])

    @property
    def path(self) -> str:
        """The file of the plan (its facts: beside it, ``.facts``)."""
        return os.path.join(self.directory, KEPT_FOLDER, f"{self.key}.pickle")

    def load(self) -> Kept | None:
        """The plan kept last, if any (and readable); its facts are read by `facts`."""
        kept = self._read(self.path)
        return kept if isinstance(kept, Kept) else None

    def facts(self, listing: str) -> dict[str, tuple[int, str, Any]]:
        """The facts of each file kept last (none where unreadable, or of another listing than
        the plan's: a process that stopped between the two writes)."""
        got = self._read(self.path + ".facts")
        if isinstance(got, tuple) and len(got) == 2 and got[0] == listing:
            return dict(got[1])
        return {}

    def save(self, kept: Kept) -> None:
        """Keep ``kept``: its facts, then its plan (each written whole, then renamed into place:
        a reader never sees half)."""
        self._write(self.path + ".facts", (kept.listing, kept.facts))
        self._write(self.path, Kept(kept.listing, kept.planned))

    def _read(self, path: str) -> Any:
        try:
            with open(path, "rb") as file:
                return pickle.load(file)
        except FileNotFoundError:
            return None
        except Exception as exc:  # a torn or foreign file: plan from scratch
            logger.warning("kept plan %s is unreadable (%s): planning from scratch", path, exc)
            return None

    def _write(self, path: str, value: Any) -> None:
        tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as file:
                pickle.dump(value, file, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except OSError as exc:  # a full or read-only disk: a restart plans from scratch
            logger.warning("cannot keep the plan in %s: %s", path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
