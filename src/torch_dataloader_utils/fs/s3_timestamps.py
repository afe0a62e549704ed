"""S3 listings with their timestamps parsed by the standard library (`quick_timestamps`).

botocore parses every timestamp of a response with dateutil: listing 2,000 objects spent 56% of
its CPU there (py-spy), on rank 0, before any rank can plan, and a listing of a million files
pays it a million times (docs/benchmarks.md#s3-listings-timestamps). The ISO 8601 timestamps
S3 listings carry are parsed with `datetime.fromisoformat`; anything else (a HEAD's HTTP date,
a number) by botocore's own parser. Either way the value is the instant botocore gives.
"""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["quick_timestamp", "quick_timestamps"]


def quick_timestamp(value: Any) -> datetime.datetime:
    """``value`` (a timestamp of an S3 response) as an aware datetime, as botocore parses it."""
    if isinstance(value, str) and value[4:5] == "-" and value[10:11] == "T":
        text = value[:-1] + "+00:00" if value.endswith("Z") else value
        try:
            parsed = datetime.datetime.fromisoformat(text)
        except ValueError:  # (e.g. more than 6 digits of a second before Python 3.11)
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    from botocore.utils import parse_timestamp

    return parse_timestamp(value)  # type: ignore[no-any-return]


def quick_timestamps(fsys: Any) -> Any:
    """``fsys`` (an fsspec filesystem); s3fs's, before its first request and without a session
    of the caller's, given the session s3fs would make, its responses' timestamps parsed with
    `quick_timestamp`."""
    if not type(fsys).__module__.startswith("s3fs") or getattr(fsys, "session", 0) is not None:
        return fsys
    from aiobotocore.session import AioSession

    session = AioSession(**fsys.kwargs)  # (what s3fs's first request would make)
    factory = session.get_component("response_parser_factory")
    factory.set_parser_defaults(timestamp_parser=quick_timestamp)
    fsys.session = session
    return fsys
