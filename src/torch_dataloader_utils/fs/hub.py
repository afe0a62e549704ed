"""Hugging Face Hub paths (``hf://``) read at one commit.

A Hub path names a repository and a revision: a branch (``main`` when none is given), a tag, a
commit, or a special ref such as ``refs/convert/parquet`` (written ``@refs%2Fconvert%2Fparquet``).
A branch moves when someone pushes, so planning resolves the revision once to its commit and
lists the files there (`fs.hub_listing`); the plan's paths carry ``@<commit>``, and its details
the commit (``"commit"``: a state saved at another commit is refused). What a commit holds
never changes, so a file's identity is its LFS sha256 (its git blob id when not in LFS) and
reading it checks nothing.

Requests are made here, through huggingface_hub's HTTP session and headers (its token,
``HF_TOKEN``, its endpoint, ``HF_ENDPOINT``), not through ``HfFileSystem``: its open asks the
repository's info and the file's paths-info in each process that reads. Planning makes one
revision request and one listing (with its pages) per path; a read is one ranged ``resolve``
GET, and an open of a file whose size this process does not know is one GET of its last bytes
(the footer a Parquet reader reads first), which tells the size. A 429 or 5xx answer is retried
after the ``Retry-After`` it gives (else a backoff), as the spec's retry policy allows.
"""

from __future__ import annotations

import functools
import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote, unquote

import pyarrow as pa

from ..errors import (
    InvalidSourceError,
    MissingDependencyError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
)
from .ranges import RangeFile
from .retry import RetryCounter, RetryPolicy

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "PROTOCOL",
    "TAIL_BYTES",
    "HubAccess",
    "HubPath",
    "check_answer",
    "endpoint",
    "open_hub",
    "pinned_at_commit",
    "read_hub_range",
    "resolve_commit",
    "send",
]

logger = logging.getLogger("torch_dataloader_utils.storage")

PROTOCOL = "hf"
T = TypeVar("T")

_COMMIT = re.compile(r"[0-9a-f]{40}")
# Statuses worth another try: throttled (429), timed out (408), the server's failures.
_RETRIED = frozenset({408, 429, 500, 502, 503, 504})
# Bytes an open fetches from a file's end when its size is unknown: the footer a Parquet
# reader asks for first (`formats.parquet.footer.TAIL_BYTES`), so the open's GET serves it.
TAIL_BYTES = 64 << 10
# Bytes a read through an opened file fetches at least: a reader streaming pages asks for
# small pieces, each a request otherwise.
_AHEAD_BYTES = 1 << 20
# The URL segment of each repository kind (a path without one names a model).
_KINDS = ("datasets", "spaces", "models")
_HINT = (
    "set HF_TOKEN (or storage_options={'token': ...}) to a token that can read it; a gated "
    "repository also needs its conditions accepted on the Hub"
)


class HubAccess(Protocol):
    """What the Hub's requests need of a `FileSystemSpec` (which `fs.spec` hands here: typed
    by its shape, so that this module sits below the filesystem that reads through it)."""

    @property
    def storage_options(self) -> dict[str, Any]: ...  # ``token``, ``endpoint``

    retry: RetryPolicy
    retries: RetryCounter

    def request(self, call: Callable[[], T], *, what: str) -> T: ...

    def read_range(self, path: str, offset: int, size: int) -> bytes: ...

    def listed(self, sizes: Iterable[tuple[str, int]]) -> None: ...

    def url(self, path: str) -> str: ...


@dataclass(frozen=True)
class HubPath:
    """A Hub path split into its parts.

    Attributes:
        kind: ``"datasets"``, ``"spaces"`` or ``"models"``.
        repo: the repository id (``org/name``).
        revision: the revision as written, unquoted (``refs/convert/parquet``); None: the
            default branch.
        inner: the path inside the repository (may hold glob characters; ``""``: all of it).
    """

    kind: str
    repo: str
    revision: str | None
    inner: str

    @classmethod
    def parse(cls, path: str) -> HubPath:
        """``path`` (without ``hf://``) split into its parts.

        Raises:
            InvalidSourceError: it names no repository.
        """
        parts = [p for p in path.strip("/").split("/") if p]
        kind = parts.pop(0) if parts and parts[0] in _KINDS else "models"
        if not parts or (len(parts) < 2 and "@" not in parts[0]):
            raise InvalidSourceError(
                f"hf://{path}: names no repository; write hf://datasets/<org>/<name>[@<revision>]"
                "/<path>"
            )
        count = 1 if "@" in parts[0] else 2  # (a model's id may have no organisation)
        repo, _, revision = "/".join(parts[:count]).partition("@")
        rest = parts[count:]
        if revision == "refs" and rest[:1] in (["convert"], ["pr"]) and len(rest) >= 2:
            revision, rest = "/".join(["refs", *rest[:2]]), rest[2:]  # (written unquoted)
        return cls(kind, repo, unquote(revision) or None, "/".join(rest))

    @property
    def label(self) -> str:
        """The repository and revision, for messages."""
        return f"hf://{self.kind}/{self.repo}@{self.revision or 'main'}"

    def at(self, commit: str, inner: str) -> str:
        """The path of ``inner`` at ``commit``, as the plan holds it."""
        return f"{self.kind}/{self.repo}@{commit}/{inner}".rstrip("/")


def pinned_at_commit(path: str) -> str | None:
    """The commit ``path`` (without ``hf://``) is read at, or None when its revision is not
    a commit sha."""
    try:
        revision = HubPath.parse(path).revision
    except InvalidSourceError:
        return None
    return revision if revision is not None and _COMMIT.fullmatch(revision) else None


def resolve_commit(hub: HubPath, spec: HubAccess) -> str:
    """The commit ``hub``'s revision names now (one request).

    Raises:
        StorageNotFoundError: the repository or revision does not exist.
        StoragePermissionError: the token cannot read the repository.
    """
    url = f"{endpoint(spec)}/api/{hub.kind}/{hub.repo}"
    if hub.revision is not None:
        url += f"/revision/{quote(hub.revision, safe='')}"
    response = send(spec, url, what=hub.label)
    check_answer(response, hub)
    commit = response.json().get("sha")
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise StorageError(f"{hub.label}: the Hub did not say which commit it is ({commit!r})")
    return commit


def open_hub(spec: HubAccess, path: str, size: int | None) -> pa.NativeFile:
    """``path`` (at a commit) opened for random access, its reads ranged ``resolve`` GETs
    (`read_hub_range`, retried by ``spec``). ``size``: what this process knows of it; None:
    one GET of its last `TAIL_BYTES` tells it, and serves the reads of them."""
    fetch = functools.partial(spec.read_range, path)
    if size is not None:
        return RangeFile(size, {}, fetch, ahead=_AHEAD_BYTES).arrow()
    total, tail = spec.request(lambda: _get(spec, path, None, TAIL_BYTES), what=spec.url(path))
    spec.listed([(path, total)])
    return RangeFile(total, {total - len(tail): tail}, fetch, ahead=_AHEAD_BYTES).arrow()


def read_hub_range(spec: HubAccess, path: str, offset: int, size: int) -> bytes:
    """Bytes ``[offset, offset + size)`` of ``path`` (at a commit): one ranged GET (none for
    no bytes: a range cannot say none)."""
    return _get(spec, path, offset, size)[1] if size > 0 else b""


def _get(spec: HubAccess, path: str, offset: int | None, size: int) -> tuple[int, bytes]:
    """The file's size and bytes ``[offset, offset + size)`` (``offset`` None: its last
    ``size`` bytes), by one GET of its ``resolve`` URL."""
    hub = HubPath.parse(path)
    prefix = "" if hub.kind == "models" else f"{hub.kind}/"
    revision = quote(hub.revision or "main", safe="")
    url = f"{endpoint(spec)}/{prefix}{hub.repo}/resolve/{revision}/{quote(hub.inner)}"
    wanted = f"bytes=-{size}" if offset is None else f"bytes={offset}-{offset + size - 1}"
    what = f"hf://{path} ({wanted})"
    response = send(spec, url, what=what, headers={"Range": wanted})
    check_answer(response, hub, f"hf://{path}")
    data = response.content
    if response.status_code == 206:  # bytes a-b/total
        total = int(response.headers.get("Content-Range", "").rpartition("/")[2] or 0)
        return total, data
    total = len(data)  # (the whole file: the server ignored the range)
    start = max(0, total - size) if offset is None else offset
    return total, data[start : start + size]


def endpoint(spec: HubAccess) -> str:
    """The Hub's URL: the storage options' ``endpoint``, else huggingface_hub's
    (``HF_ENDPOINT``)."""
    endpoint = spec.storage_options.get("endpoint")
    if not endpoint:
        endpoint = _hub().constants.ENDPOINT
    return str(endpoint).rstrip("/")


def _hub() -> Any:
    """huggingface_hub, imported when a Hub path is read.

    Raises:
        MissingDependencyError: it is not installed.
    """
    try:
        import huggingface_hub
        import huggingface_hub.constants
    except ImportError as exc:
        raise MissingDependencyError(
            f"hf:// paths need huggingface_hub ({exc}): pip install 'torch-dataloader-utils[hf]'"
        ) from exc
    return huggingface_hub


def send(
    spec: HubAccess,
    url: str,
    *,
    what: str,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
) -> httpx2.Response:
    """One GET of ``url`` with the Hub's headers (its token), retried as ``spec.retry``
    allows on a dropped connection or a status in `_RETRIED`, after the ``Retry-After`` the
    answer gives, else a backoff. The last answer is returned, whatever its status.

    Raises:
        StorageError: the connection failed on every attempt.
    """
    _hub()
    import httpx2
    from huggingface_hub import get_session
    from huggingface_hub.utils._headers import build_hf_headers  # (not re-exported for mypy)

    sent = {**build_hf_headers(token=spec.storage_options.get("token")), **(headers or {})}
    policy = spec.retry
    rng = random.Random()
    for attempt in range(1, policy.max_attempts + 1):
        wait: float | None = None
        try:
            response = get_session().get(
                url,
                headers=sent,
                params=params,
                follow_redirects=True,  # (the Hub sends LFS files' bytes from a CDN)
                timeout=policy.request_timeout,
            )
        except httpx2.TransportError as exc:
            if attempt == policy.max_attempts:
                failed = StorageError(f"{what}: failed after {attempt} attempt(s): {exc}")
                failed.final = True  # type: ignore[attr-defined]  # no more retries upstream
                raise failed from exc
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code not in _RETRIED or attempt == policy.max_attempts:
                return response
            wait = _retry_after(response.headers)
            reason = f"HTTP {response.status_code}"
        if wait is None:
            wait = policy.backoff(attempt, rng)
        spec.retries.add()
        logger.warning(
            "%s: %s; retry %d of %d in %.2f s", what, reason, attempt, policy.max_attempts - 1, wait
        )
        time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (a number; a date is not read)."""
    value = (headers.get("Retry-After") or "").strip()
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def check_answer(response: httpx2.Response, hub: HubPath, url: str | None = None) -> None:
    """Nothing when ``response`` succeeded; else its failure as our error, naming the
    repository, the revision (and ``url``) and what to do.

    Raises:
        StorageNotFoundError: the repository, revision or file does not exist.
        StoragePermissionError: 401/403: private, gated, or a token without access.
        StorageError: any other failure (after the retries `send` made).
    """
    status = response.status_code
    if status < 400:
        return
    from huggingface_hub import hf_raise_for_status
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = url or hub.label
    try:
        hf_raise_for_status(response)
    except GatedRepoError as exc:
        raise StoragePermissionError(f"{where}: {hub.repo} is gated: {_HINT}") from exc
    except RepositoryNotFoundError as exc:
        if status in (401, 403):
            raise StoragePermissionError(
                f"{where}: repository {hub.repo} not found, or private ({status}): {_HINT}"
            ) from exc
        raise StorageNotFoundError(
            f"{where}: repository {hub.repo} not found on {_endpoint_of(response)} (check the "
            "name, and the kind: hf://datasets/... for a dataset)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise StorageNotFoundError(
            f"{where}: revision {hub.revision!r} not found in {hub.repo} (name a branch, a tag "
            "or a commit; refs/convert/parquet is written @refs%2Fconvert%2Fparquet)"
        ) from exc
    except HfHubHTTPError as exc:
        detail = " ".join(str(exc).split())[:300]
        if status in (401, 403):
            raise StoragePermissionError(f"{where}: permission denied ({detail}): {_HINT}") from exc
        if status == 404:
            raise StorageNotFoundError(f"{where}: not found ({detail})") from exc
        failed = StorageError(f"{where}: {detail}")
        failed.final = True  # type: ignore[attr-defined]  # (`send` retried what it could)
        raise failed from exc
    raise StorageError(f"{where}: HTTP {status}")  # (hf_raise_for_status let it through)


def _endpoint_of(response: httpx2.Response) -> str:
    """The scheme and host ``response`` came from."""
    return f"{response.url.scheme}://{response.url.host}"
