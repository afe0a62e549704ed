"""Retries of storage requests: the policy, the classification of failures, the retry loop, and
the retry counter shared by DataLoader worker processes."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torch_dataloader_utils.errors import InvalidArgumentError, StorageError
from torch_dataloader_utils.fs import FileSystemSpec, RetryCounter, RetryPolicy, is_transient
from torch_dataloader_utils.fs.retry import retrying

SECRET = "s3cr3t-do-not-log"
WHAT = "s3://bkt/data/part-0.parquet bytes 0-1023"
FAST = RetryPolicy(max_attempts=4, initial_delay=0.001, max_delay=0.002)

# Messages in the shape pyarrow's S3 filesystem builds them (arrow/filesystem/s3fs.cc and
# s3_internal.h: a prefix naming key and bucket, then "AWS Error <NAME> during <Operation>
# operation: <message>", with "(HTTP status N)" added for UNKNOWN).
GET = "When reading from key 'data/part-0.parquet' in bucket 'bkt': "
HEAD = "When reading information for key 'data/part-503.parquet' in bucket 'bkt': "
SLOW_DOWN = GET + "AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate."
ACCESS_DENIED = HEAD + "AWS Error ACCESS_DENIED during HeadObject operation: Access Denied"
NETWORK = (
    GET + "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56, "
    "Failure when receiving data from the peer"
)


# --- RetryPolicy -------------------------------------------------------------------------------


def test_policy_defaults_and_validation() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 6
    assert policy.initial_delay == 0.1 and policy.max_delay == 10.0 and policy.multiplier == 2.0
    for bad in (
        {"max_attempts": 0},
        {"initial_delay": -0.1},
        {"max_delay": -1.0},
        {"multiplier": 0.5},
    ):
        with pytest.raises(InvalidArgumentError):
            RetryPolicy(**bad)  # type: ignore[arg-type]
    RetryPolicy(max_attempts=1, initial_delay=0, max_delay=0, multiplier=1)  # all at the edge


def test_policy_of() -> None:
    assert RetryPolicy.of(None) == RetryPolicy()
    custom = RetryPolicy(max_attempts=2)
    assert RetryPolicy.of(custom) is custom
    assert RetryPolicy.of(0).max_attempts == 1
    assert RetryPolicy.of(5).max_attempts == 6
    for bad in (-1, True, False, 2.0, "3"):
        with pytest.raises(InvalidArgumentError, match="retries"):
            RetryPolicy.of(bad)  # type: ignore[arg-type]


def test_backoff_is_full_jitter_under_a_growing_then_saturating_cap() -> None:
    policy = RetryPolicy(initial_delay=0.1, multiplier=2.0, max_delay=1.0)
    caps = [min(1.0, 0.1 * 2.0 ** (n - 1)) for n in range(1, 9)]
    assert caps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0])
    rng = random.Random(1234)
    reference = random.Random(1234)
    highest = [0.0] * len(caps)
    for _ in range(400):
        for n, cap in enumerate(caps, start=1):
            delay = policy.backoff(n, rng)
            assert 0.0 <= delay <= cap
            # Exactly one uniform draw over [0, cap] (a seeded source replays it).
            assert delay == reference.uniform(0.0, cap)
            highest[n - 1] = max(highest[n - 1], delay)
    # With 400 draws each, the largest delay comes close to its cap: caps grow, then saturate.
    for top, cap in zip(highest, caps, strict=True):
        assert top > 0.95 * cap
    assert highest[0] < highest[1] < highest[2] < highest[3] <= 1.0
    # Jitter: the draws of one retry are spread out, not a constant.
    draws = {policy.backoff(3, rng) for _ in range(50)}
    assert len(draws) == 50


def test_backoff_with_zero_delay_is_zero() -> None:
    policy = RetryPolicy(initial_delay=0.0)
    assert all(policy.backoff(n, random.Random(n)) == 0.0 for n in range(1, 10))


# --- is_transient ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        SLOW_DOWN,
        NETWORK,
        GET + "AWS Error THROTTLING during GetObject operation: Rate exceeded",
        GET + "AWS Error SERVICE_UNAVAILABLE during GetObject operation: Service Unavailable",
        GET + "AWS Error INTERNAL_FAILURE during GetObject operation: ",
        GET + "AWS Error REQUEST_TIMEOUT during GetObject operation: Request timed out",
        GET + "AWS Error UNKNOWN (HTTP status 503) during GetObject operation: ",
        GET + "AWS Error UNKNOWN (HTTP status 500) during GetObject operation: ",
        GET + "AWS Error UNKNOWN (HTTP status 429) during GetObject operation: ",
        GET + "AWS Error UNKNOWN (HTTP status 408) during GetObject operation: ",
        "Connection reset by peer",
        "Unexpected EOF while reading the response",
    ],
)
def test_transient_pyarrow_messages(message: str) -> None:
    assert is_transient(OSError(message))


@pytest.mark.parametrize(
    "message",
    [
        ACCESS_DENIED,
        HEAD + "AWS Error UNKNOWN (HTTP status 404) during HeadObject operation: No response body.",
        HEAD + "AWS Error UNKNOWN (HTTP status 403) during HeadObject operation: No response body.",
        # An expired session token answers HEAD with a bare 400.
        HEAD + "AWS Error UNKNOWN (HTTP status 400) during HeadObject operation: No response body.",
        "When reading from key 'data/part-503.parquet' in bucket 'bkt': AWS Error NO_SUCH_KEY "
        "during GetObject operation: The specified key does not exist.",
        "When listing objects under key 'x' in bucket 'no-such': AWS Error NO_SUCH_BUCKET "
        "during ListObjectsV2 operation: The specified bucket does not exist",
        GET + "AWS Error SIGNATURE_DOES_NOT_MATCH during GetObject operation: The request "
        "signature we calculated does not match the signature you provided.",
        GET + "AWS Error INVALID_ACCESS_KEY_ID during GetObject operation: The AWS Access Key "
        "Id you provided does not exist in our records.",
        # Numbers and words inside quoted keys are never read as a status or a cause.
        "When reading from key 'logs/status 503/timeout-500.parquet' in bucket 'bkt': AWS Error "
        "NO_SUCH_KEY during GetObject operation: The specified key does not exist.",
        "Parquet magic bytes not found in footer. Either the file is corrupted or this is not "
        "a parquet file.",
    ],
)
def test_permanent_pyarrow_messages(message: str) -> None:
    assert not is_transient(OSError(message))


def test_classification_by_exception_type() -> None:
    # Imported here: spawn workers import this module, and need none of these.
    import aiohttp
    import botocore.exceptions
    import requests
    import urllib3

    missing = FileNotFoundError(errno.ENOENT, "Path does not exist 'bkt/data/part-503.parquet'")
    assert not is_transient(missing)
    # A subclass of a permanent type stays permanent, whatever its message says.
    assert not is_transient(PermissionError(errno.EACCES, "timeout 503 SLOW_DOWN"))
    assert not is_transient(IsADirectoryError(errno.EISDIR, "is a directory"))
    assert is_transient(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
    assert is_transient(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    assert is_transient(TimeoutError("The read operation timed out"))
    # Third-party transient types, matched by name anywhere in the MRO.
    assert is_transient(aiohttp.ServerDisconnectedError())
    assert is_transient(aiohttp.ClientConnectionError("boom"))
    assert is_transient(botocore.exceptions.ReadTimeoutError(endpoint_url="http://h"))
    assert is_transient(botocore.exceptions.EndpointConnectionError(endpoint_url="http://h"))
    assert is_transient(requests.exceptions.ChunkedEncodingError("Connection broken"))
    assert is_transient(urllib3.exceptions.ProtocolError("Connection aborted."))
    # Not an OSError: never storage, even with storage-like words.
    assert not is_transient(ValueError("timeout SLOW_DOWN 503"))
    assert not is_transient(pa.ArrowInvalid("timed out"))
    assert not is_transient(KeyError("x"))


def test_status_before_words_and_first_status_wins() -> None:
    # A 4xx status is permanent even when a transient-sounding word follows.
    assert not is_transient(OSError("HTTP status 404: request timed out"))
    assert is_transient(OSError("HTTP status 503: Access Denied"))
    # 2xx/3xx statuses say nothing: the words decide.
    assert is_transient(OSError("status 200 but connection reset by peer"))
    assert not is_transient(OSError("status 301 and nothing else"))


def test_azure_server_busy_is_transient() -> None:
    message = (
        "DownloadTo from 'https://acct.blob.core.windows.net/c/part-0.parquet' at position 0 "
        "for 1024 bytes failed. ReadAt failed to read the required byte range. Azure Error: "
        "[ServerBusy] 503 Server Busy\nThe server is busy.\nRequest ID: 0f1e"
    )
    assert is_transient(OSError(message))


def test_gcs_unavailable_is_transient() -> None:
    message = "google::cloud::Status(UNAVAILABLE: Retry policy exhausted in GetObjectMetadata)"
    assert is_transient(OSError(message))


# --- retrying ----------------------------------------------------------------------------------


class Flaky:
    """Raises ``errors`` in turn, then returns ``value``; counts calls."""

    def __init__(self, errors: list[BaseException], value: object = b"data") -> None:
        self.errors = list(errors)
        self.value = value
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.value


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "torch_dataloader_utils.storage" and r.levelno == logging.WARNING
    ]


def test_transient_failures_are_retried_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="torch_dataloader_utils.storage")
    call = Flaky([OSError(SLOW_DOWN), OSError(NETWORK), ConnectionResetError("reset")])
    counter = RetryCounter()
    result = retrying(call, what=WHAT, policy=FAST, counter=counter, rng=random.Random(0))
    assert result == b"data"
    assert call.calls == 4
    assert counter.total == 3
    records = warnings_of(caplog)
    assert len(records) == 3
    for n, record in enumerate(records, start=1):
        text = record.getMessage()
        assert text.startswith(WHAT + ": ")
        assert f"retry {n} of 3" in text
        assert SECRET not in text
    assert "SLOW_DOWN" in records[0].getMessage()
    assert "curlCode: 56" in records[1].getMessage()


def test_retrying_without_counter_or_rng() -> None:
    assert retrying(Flaky([OSError(SLOW_DOWN)], 7), what=WHAT, policy=FAST) == 7


def test_permanent_failure_raises_at_once_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="torch_dataloader_utils.storage")
    denied = OSError(ACCESS_DENIED)
    call = Flaky([denied])
    counter = RetryCounter()
    with pytest.raises(OSError) as info:
        retrying(call, what=WHAT, policy=FAST, counter=counter)
    assert info.value is denied
    assert not isinstance(info.value, StorageError)
    assert call.calls == 1
    assert counter.total == 0
    assert warnings_of(caplog) == []
    # Non-storage errors pass through too.
    with pytest.raises(ZeroDivisionError):
        retrying(lambda: 1 // 0, what=WHAT, policy=FAST)


def test_exhaustion_raises_storage_error_naming_file_and_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="torch_dataloader_utils.storage")
    errors = [OSError(SLOW_DOWN) for _ in range(10)]
    call = Flaky(errors)
    counter = RetryCounter()
    policy = RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=0.001)
    with pytest.raises(StorageError) as info:
        retrying(call, what=WHAT, policy=policy, counter=counter)
    message = str(info.value)
    assert message.startswith(f"{WHAT}: failed after 3 attempt(s): ")
    assert "SLOW_DOWN" in message
    assert isinstance(info.value, OSError)  # StorageError is an OSError for user code
    assert isinstance(info.value.__cause__, OSError)
    assert "SLOW_DOWN" in str(info.value.__cause__)
    assert call.calls == 3
    assert counter.total == 2  # retries, not attempts
    assert len(warnings_of(caplog)) == 2


def test_single_attempt_policy_never_retries() -> None:
    call = Flaky([TimeoutError("timed out")])
    with pytest.raises(StorageError, match=r"failed after 1 attempt\(s\)"):
        retrying(call, what=WHAT, policy=RetryPolicy.of(0))
    assert call.calls == 1


def test_long_messages_are_shortened_in_logs_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="torch_dataloader_utils.storage")
    long = OSError(SLOW_DOWN + " " + "x" * 2000 + "\n\n  tail")
    policy = RetryPolicy(max_attempts=2, initial_delay=0.0)
    with pytest.raises(StorageError) as info:
        retrying(Flaky([long, long]), what=WHAT, policy=policy)
    (record,) = warnings_of(caplog)
    assert "..." in record.getMessage() and "tail" not in record.getMessage()
    assert len(str(info.value)) < len(WHAT) + 400


def test_delays_follow_the_policy() -> None:
    # Sleeps are real: with initial_delay 50 ms (caps 50 ms, then 100 ms) two retries sleep
    # what a source seeded the same way draws.
    policy = RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=1.0)
    rng = random.Random(5)
    expected = policy.backoff(1, rng) + policy.backoff(2, rng)
    start = time.perf_counter()
    retrying(
        Flaky([OSError(SLOW_DOWN), OSError(SLOW_DOWN)]),
        what=WHAT,
        policy=policy,
        rng=random.Random(5),
    )
    elapsed = time.perf_counter() - start
    assert expected - 0.005 <= elapsed <= expected + 0.5


# --- RetryCounter ------------------------------------------------------------------------------


def test_counter_counts_threads_exactly() -> None:
    counter = RetryCounter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: [counter.add() for _ in range(500)], range(8)))
    assert counter.total == 4000
    counter.add(5)
    assert counter.total == 4005


def test_counter_plain_pickle_copies_the_counts() -> None:
    counter = RetryCounter()
    counter.add(2)
    copy = pickle.loads(pickle.dumps(counter))
    assert copy.total == 2
    copy.add()
    assert copy.total == 3
    copy.add()  # the copy has its own lock, usable after unpickling
    assert copy.total == 4


class CountingDataset(IterableDataset[tuple[int, int]]):
    """Each worker adds ``worker id + 1`` retries through the spec it was given (module level:
    spawn workers import it)."""

    def __init__(self, spec: FileSystemSpec) -> None:
        self.spec = spec

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = get_worker_info()
        assert info is not None
        self.spec.retries.add(info.id + 1)
        yield info.id, os.getpid()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_counter_sees_worker_processes(context: str) -> None:
    spec = FileSystemSpec("memory", {"k": "v"})
    spec.retries.add(10)  # the main process
    loader = DataLoader(
        CountingDataset(spec), batch_size=None, num_workers=2, multiprocessing_context=context
    )
    seen = list(loader)
    assert sorted(worker for worker, _ in seen) == [0, 1]
    assert all(pid != os.getpid() for _, pid in seen)  # really other processes
    assert spec.retries.total == 10 + 1 + 2
    if context == "fork":  # (spawn workers cost seconds each: one epoch of them is enough)
        # A second epoch (new worker processes) keeps adding to the same memory.
        list(loader)
        assert spec.retries.total == 10 + 2 * (1 + 2)


def test_gcs_resource_exhausted_is_transient() -> None:
    assert is_transient(pa.ArrowCapacityError("google::cloud::Status(RESOURCE_EXHAUSTED: rate)"))


def test_refused_and_missing_from_native_messages() -> None:
    from torch_dataloader_utils.fs.retry import is_missing, is_refused

    denied = OSError(
        "When reading information for key 'data/part-404.parquet' in bucket 'b': AWS Error "
        "ACCESS_DENIED during HeadObject operation: No response body."
    )
    assert is_refused(denied) and not is_missing(denied) and not is_transient(denied)
    expired = OSError(
        "AWS Error UNKNOWN (HTTP status 400) during GetObject operation: ExpiredToken"
    )
    assert is_refused(expired)
    gone = OSError("AWS Error NO_SUCH_KEY during GetObject operation: 'part-403.parquet'")
    assert is_missing(gone) and not is_refused(gone)
    assert is_refused(
        OSError("Azure Error: [AuthorizationFailure] 403 This request is not authorized")
    )
    assert not is_refused(OSError("AWS Error SLOW_DOWN during GetObject operation"))


def test_our_translated_errors_are_judged_by_their_cause() -> None:
    from torch_dataloader_utils import StorageError
    from torch_dataloader_utils.fs import translate_os_error

    url = "s3://logs/status=404/part-0.parquet"  # a hive key that looks like a status
    slow = OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your rate")
    translated = translate_os_error(slow, url)
    translated.__cause__ = slow
    assert is_transient(translated)
    reset = translate_os_error(ConnectionResetError(104, "reset"), url)
    reset.__cause__ = ConnectionResetError(104, "reset")
    assert is_transient(reset)
    spent = StorageError(f"{url}: failed after 3 attempt(s)")
    spent.__cause__ = slow
    spent.final = True  # type: ignore[attr-defined]
    assert not is_transient(spent)


def test_an_expired_token_on_a_head_request_counts_as_refused() -> None:
    from torch_dataloader_utils.fs.retry import is_refused

    head = OSError("AWS Error UNKNOWN (HTTP status 400) during HeadObject operation: No body.")
    assert is_refused(head) and not is_transient(head)
