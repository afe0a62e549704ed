"""The corpus test's outcomes as a table per source: ``python -m tests.corpus.report``.

Runs the same two reads per file as `tests/corpus/test_corpus.py` and counts, per source
directory: files, files read exactly as the reference (both reads), files the reference
refuses and the library refuses with a clear error, files refused as unsupported (and why),
files refused as stricter than the reference, and failures (none when the test passes).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter, defaultdict

from tests.corpus.cases import all_cases
from tests.corpus.pool import Runner
from tests.corpus.test_corpus import STRICTER, TIMEOUT, UNSUPPORTED, _configs, judge


def _reason(message: str) -> str:
    """A short reason from an unsupported-file message."""
    for pattern, reason in (
        (r"two columns are named", "duplicate column names"),
        (r"month_interval|day_time_interval", "interval type pyarrow cannot expose"),
        (r"compressed", "whole-shard compressed tar"),
        (r"encrypted", "encrypted Parquet"),
    ):
        if re.search(pattern, message):
            return reason
    return message[:60]


def main() -> None:
    runner = Runner()
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    seconds: Counter[str] = Counter()
    try:
        for case in all_cases():
            source = case.relpath.split("/", 1)[0]
            outcomes = set()
            started = time.perf_counter()
            for config in _configs(case):
                verdict = runner.run({"case": dataclasses.asdict(case), "config": config}, TIMEOUT)
                wrong = judge(case, verdict)
                error = verdict.get("error") or {}
                if wrong is not None:
                    outcomes.add("failed")
                elif verdict["verdict"] == "match":
                    outcomes.add("matched")
                elif verdict.get("reference") != "ok":
                    outcomes.add("reference fails: clear error")
                elif case.relpath in STRICTER:
                    outcomes.add("stricter than the reference")
                elif error.get("type") in UNSUPPORTED:
                    outcomes.add("unsupported")
                    reasons[source][_reason(error.get("message", ""))] += 1
            seconds[source] += time.perf_counter() - started
            rows[source]["files"] += 1
            for outcome in outcomes:
                rows[source][outcome] += 1
    finally:
        runner.close()
    columns = [
        "files",
        "matched",
        "reference fails: clear error",
        "unsupported",
        "stricter than the reference",
        "failed",
    ]
    print("| source | " + " | ".join(columns) + " | seconds | unsupported, why |")
    print("|---" * (len(columns) + 3) + "|")
    for source in sorted(rows):
        why = ", ".join(f"{r} ({n})" for r, n in reasons[source].most_common())
        counts = " | ".join(str(rows[source][c]) for c in columns)
        print(f"| {source} | {counts} | {seconds[source]:.0f} | {why} |")


if __name__ == "__main__":
    main()
