"""Retries of storage requests: capped exponential backoff with full jitter, counted and logged.

Only transient failures are retried: throttling (503 SlowDown, 429), other 5xx answers,
timeouts, refused/reset/dropped connections. A missing object (404) or a refused credential
(403) fails at once. After the last attempt a `StorageError` names the file.

pyarrow's native filesystems raise plain ``OSError`` whose only structure is the message
(for example ``AWS Error SLOW_DOWN during GetObject operation``), so those are classified by
the AWS error names and HTTP statuses in the text, with quoted parts (keys, paths) removed
first so a file named ``part-503.parquet`` is never mistaken for a status.
"""

from __future__ import annotations

import errno
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa

from ..errors import InvalidArgumentError, StorageError
from .counts import SharedCounts

__all__ = [
    "RetryCounter",
    "RetryPolicy",
    "as_os_error",
    "is_missing",
    "is_refused",
    "is_transient",
    "retrying",
    "scrub",
]

logger = logging.getLogger("torch_dataloader_utils.storage")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How storage requests are retried.

    The delay before retry ``n`` (1-based) is uniform in ``[0, min(max_delay, initial_delay *
    multiplier ** (n - 1))]`` ("full jitter": clients that failed together do not retry
    together).

    Attributes:
        max_attempts: tries per request, the first included (1: no retries).
        initial_delay: seconds; the cap of the first backoff.
        max_delay: seconds; no backoff exceeds it.
        multiplier: growth of the cap per retry.
        request_timeout: seconds without progress before a request counts as failed (native
            filesystems; fsspec filesystems take their own timeout options).
    """

    max_attempts: int = 6
    initial_delay: float = 0.1
    max_delay: float = 10.0
    multiplier: float = 2.0
    request_timeout: float | None = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise InvalidArgumentError(
                "initial_delay and max_delay must be >= 0 and multiplier >= 1, got "
                f"{self.initial_delay}, {self.max_delay}, {self.multiplier}"
            )

    @classmethod
    def of(cls, value: RetryPolicy | int | None) -> RetryPolicy:
        """A policy from ``retries=``: a policy, a number of retries, or ``None`` (default)."""
        if value is None:
            return cls()
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(
                f"retries must be a RetryPolicy or a number of retries >= 0, got {value!r}"
            )
        return cls(max_attempts=value + 1)

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        cap = min(self.max_delay, self.initial_delay * self.multiplier ** (retry - 1))
        return rng.uniform(0.0, cap)


class RetryCounter(SharedCounts):
    """Retries made, summed over the main process and its DataLoader workers
    (``dataset.storage_retries``)."""

    def add(self, n: int = 1) -> None:  # type: ignore[override]
        """Count ``n`` retries made by this process."""
        super().add({0: n})

    @property
    def total(self) -> int:
        """Retries so far, in all processes."""
        return self.totals()[0]


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
# An HTTP status: after "status"/"code"/"HTTP", or after a bracketed error name (Azure's
# "[ServerBusy] 503 Server Busy").
_STATUS = re.compile(r"(?:\b(?:status|code|HTTP)\D{0,12}|\]\s*)(\d{3})\b", re.IGNORECASE)
# (s3fs turns S3's 503 SlowDown into OSError(EBUSY, "Please reduce your request rate."): its
# message names neither.)
_TRANSIENT_WORDS = re.compile(
    r"SLOW_?DOWN|reduce your request rate|THROTTL|TOO_?MANY_?REQUESTS|UNAVAILABLE"
    r"|INTERNAL_?(?:ERROR|FAILURE)|SERVER_?BUSY"
    r"|RESOURCE_?EXHAUSTED|DEADLINE_?EXCEEDED|OPERATION_?TIMED_?OUT"
    r"|REQUEST_?TIMEOUT|NETWORK_?CONNECTION|timed? ?out|timeout|connection (?:reset|refused|"
    r"aborted|closed)|reset by peer|broken pipe|curl error|unexpected eof|end of file|"
    r"incomplete|server disconnected|premature|could not connect|couldn't connect",
    re.IGNORECASE,
)
_REFUSED_WORDS = re.compile(
    r"ACCESS_?DENIED|SIGNATURE_?DOES_?NOT_?MATCH|INVALID_?ACCESS_?KEY|EXPIRED_?TOKEN|"
    r"TOKEN_?REFRESH_?REQUIRED|AUTHENTICATION_?FAILED|AUTHORIZATION_?FAILURE|FORBIDDEN|"
    r"PERMISSION_?DENIED|UNAUTHENTICATED",
    re.IGNORECASE,
)
_MISSING_WORDS = re.compile(r"NO_?SUCH_?(?:KEY|BUCKET)|NOT_?FOUND|BLOB_?NOT_?FOUND", re.IGNORECASE)
# Exception class names (anywhere in the MRO) of transient failures from aiohttp, botocore,
# requests and urllib3, matched by name so none of them has to be importable.
_TRANSIENT_TYPES = frozenset(
    {
        "ClientConnectionError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "ClientPayloadError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "IncompleteRead",
        "ProtocolError",
        "ChunkedEncodingError",
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure worth retrying (see the module docstring)."""
    if isinstance(exc, StorageError):
        # Ours, translated from the failure that caused it: judged by that one, unless its
        # retries are already spent.
        cause = exc.__cause__
        return cause is not None and not getattr(exc, "final", False) and is_transient(cause)
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
        return False
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if any(t.__name__ in _TRANSIENT_TYPES for t in type(exc).__mro__):
        return True
    if not isinstance(exc, OSError | pa.ArrowCapacityError):
        return False  # (pyarrow raises GCS's RESOURCE_EXHAUSTED as ArrowCapacityError)
    code = _status(exc)
    if code is not None:
        return code in (408, 429) or 500 <= code <= 599
    text = _text(exc)
    if _REFUSED_WORDS.search(text) or _MISSING_WORDS.search(text):
        return False
    return bool(_TRANSIENT_WORDS.search(text))


def _text(exc: BaseException) -> str:
    return _QUOTED.sub("''", str(exc))


def _status(exc: BaseException) -> int | None:
    """The first 4xx/5xx HTTP status in the message, if any."""
    for status in _STATUS.findall(_text(exc)):
        code = int(status)
        if 400 <= code <= 599:
            return code
    return None


def is_refused(exc: BaseException) -> bool:
    """Whether ``exc`` says the credentials were refused (403, access denied, expired)."""
    if isinstance(exc, PermissionError):
        return True
    if not isinstance(exc, OSError) or isinstance(exc, FileNotFoundError):
        return False
    code = _status(exc)
    if code in (401, 403):
        return True
    if code == 400 and "HEADOBJECT" in str(exc).upper():
        return True  # S3 answers a HEAD with an expired token with a bare 400 (no body)
    # S3 answers an expired token with 400 ExpiredToken.
    return (code is None or code == 400) and bool(_REFUSED_WORDS.search(_text(exc)))


def is_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the object does not exist (404, no such key)."""
    if isinstance(exc, FileNotFoundError):
        return True
    if not isinstance(exc, OSError):
        return False
    code = _status(exc)
    return code == 404 or (code is None and bool(_MISSING_WORDS.search(_text(exc))))


# SDK errors that are not OSError but carry an HTTP status (azure-core, google-api-core,
# botocore), matched by class name so none of them has to be importable.
_HTTP_ERROR_TYPES = frozenset(
    {"HttpResponseError", "GoogleAPICallError", "HttpError", "ClientError"}
)


# Packages whose exceptions are storage failures when listing or reading (their other
# exceptions are not OSError: botocore's NoCredentialsError, aiohttp's InvalidURL, ...).
_SDK_PACKAGES = frozenset(
    {
        "botocore",
        "aiobotocore",
        "aiohttp",
        "s3fs",
        "gcsfs",
        "adlfs",
        "google",
        "azure",
        "requests",
        "urllib3",
    }
)


def is_sdk_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a storage SDK (by its class's package)."""
    return type(exc).__module__.split(".", 1)[0] in _SDK_PACKAGES


def as_os_error(exc: BaseException) -> OSError | None:
    """``exc`` as the matching ``OSError`` when it is an SDK error with an HTTP status: 404
    becomes ``FileNotFoundError``, 401/403 ``PermissionError``, others an ``OSError`` whose
    message starts with the status (so `is_transient` reads it). ``None`` otherwise."""
    if isinstance(exc, OSError):
        return exc
    if not any(t.__name__ in _HTTP_ERROR_TYPES for t in type(exc).__mro__):
        return None
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(exc, "code", None)
    if status is None:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if not isinstance(status, int):
        return None
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    if status == 404:
        return FileNotFoundError(errno.ENOENT, detail)
    if status in (401, 403):
        return PermissionError(errno.EACCES, detail)
    return OSError(f"HTTP status {status}: {detail}")


# Signatures that URLs in storage errors can carry (Azure SAS, presigned S3/GCS URLs).
_SIGNATURES = re.compile(
    r"((?:sig|signature|x-amz-signature|x-goog-signature|x-amz-security-token)=)[^&\s'\"/]+",
    re.IGNORECASE,
)


def scrub(text: str) -> str:
    """``text`` with URL signatures masked."""
    return _SIGNATURES.sub(r"\1***", text)


def _describe(exc: BaseException) -> str:
    text = scrub(" ".join(str(exc).split())) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def retrying(
    call: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    counter: RetryCounter | None = None,
    rng: random.Random | None = None,
) -> T:
    """``call()``, retried on transient failures as ``policy`` says.

    Args:
        call: the request.
        what: the file (and range) for messages, e.g. ``s3://bucket/key bytes 0-1023``.
        policy: the retry policy.
        counter: counts each retry.
        rng: jitter source (default: a fresh one).

    Raises:
        StorageError: a transient failure persisted through every attempt (names ``what``).
        Exception: a permanent failure, unchanged (the caller translates it).
    """
    # Made on the first retry, not for every request
    # (docs/adr/0020-measurements-behind-constants.md#retries).
    random_source = rng
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return call()
        except Exception as raised:
            exc: BaseException = as_os_error(raised) or raised
            if not is_transient(exc):
                if exc is not raised:
                    raise exc from raised
                raise
            if attempt == policy.max_attempts:
                final = StorageError(f"{what}: failed after {attempt} attempt(s): {_describe(exc)}")
                final.final = True  # type: ignore[attr-defined]  # no more retries upstream
                raise final from exc
            if random_source is None:
                random_source = random.Random()
            delay = policy.backoff(attempt, random_source)
            if counter is not None:
                counter.add()
            logger.warning(
                "%s: %s; retry %d of %d in %.2f s",
                what,
                _describe(exc),
                attempt,
                policy.max_attempts - 1,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
