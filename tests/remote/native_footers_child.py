"""The child process of `test_native_footers`: reads the footer of each file named on stdin
(JSON) through the byte path and through pyarrow's C++ reader (`facts._native_footer`) on the
same store, and prints what differs, one JSON line. A child, so that a file pyarrow's parser
crashes on, or hangs on, fails the test rather than the test process."""

from __future__ import annotations

import json
import sys
from typing import Any

from torch_dataloader_utils.formats import ReadOptions
from torch_dataloader_utils.formats.parquet import facts as parquet_facts
from torch_dataloader_utils.formats.parquet.facts import FileFacts, read_facts
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile


def _outcome(read: Any) -> tuple[str, Any]:
    try:
        facts: FileFacts = read()
    except Exception as exc:  # (what either path raises is compared, whatever it is)
        return "error", f"{type(exc).__name__}: {exc}"
    schema = facts.schema
    return "facts", (
        schema.to_string(show_field_metadata=True, show_schema_metadata=True),
        facts.row_groups,
        facts.renamed,
        facts.tokens,
    )


def main() -> None:
    request = json.loads(sys.stdin.read())
    fs = FileSystemSpec("s3", request["storage_options"])
    native = fs.native_reads()
    assert native is not None
    options = ReadOptions(**request.get("options", {}))
    differing = []
    read_natively = []
    for path, size in request["files"]:
        listed = ListedFile(path, size, "")
        fs.listed([(path, size)])
        bytes_read = _outcome(lambda: read_facts(listed, (), fs, options))  # noqa: B023
        natively = _outcome(lambda: read_facts(listed, (), fs, options, native=native))  # noqa: B023
        if natively != bytes_read:
            differing.append({"path": path, "bytes": repr(bytes_read), "native": repr(natively)})
        if parquet_facts._native_footer(listed, (), native, options.filter is not None):
            read_natively.append(path)
    print(json.dumps({"differing": differing, "native": read_natively}))


if __name__ == "__main__":
    main()
