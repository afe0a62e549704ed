"""The fork check of the `Format` contract: a format used in a process reads the same in a
child forked from it, as DataLoader workers are forked from the process that planned.

A child inherits a copy of everything its parent's format holds: open files, storage clients,
thread pools, reads started ahead. Used in the child, they read wrong bytes or hang (seen in
practice: a file offset shared with the parent; a pooled connection's "Weird server reply"; a
read submitted to a thread pool whose threads exist only in the parent, which never runs).
Keep such things in a `torch_dataloader_utils.fs.forks.ProcessLocal`, as the built-in formats
do, and this check passes.
"""

from __future__ import annotations

import multiprocessing
import traceback
from multiprocessing.connection import Connection

import pyarrow as pa

from ..formats import Format, ReadOptions
from ..fs import FileSystemSpec
from ..planning import Chunk

__all__ = ["check_fork"]


def _read(
    fmt: Format, chunk: Chunk, fs: FileSystemSpec, options: ReadOptions, schema: pa.Schema
) -> pa.Table:
    batches = list(fmt.read(chunk, 0, chunk.num_rows, fs, options))
    return pa.Table.from_batches(batches, schema=schema)


def _child(
    answer: Connection,
    *,
    fmt: Format,
    chunk: Chunk,
    fs: FileSystemSpec,
    options: ReadOptions,
    want: pa.Table,
) -> None:
    """In the forked child: read the chunk, compare, close, and send what went wrong (or
    ``None``). Everything but ``answer`` was inherited, never pickled."""
    try:
        got = _read(fmt, chunk, fs, options, want.schema)
        fmt.close()  # the child's own; what it inherited must stay open for the parent
        message = None if got.equals(want) else "read other rows than its parent"
    except BaseException:  # anything at all: the parent reports it
        message = "raised\n" + traceback.format_exc()
    answer.send(message)
    answer.close()


def check_fork(
    fmt: Format,
    chunk: Chunk,
    *,
    fs: FileSystemSpec,
    options: ReadOptions,
    schema: pa.Schema,
    timeout: float = 60.0,
) -> None:
    """``fmt`` reads ``chunk`` the same in a child forked while this process is mid-read, and
    this process still reads the same afterwards.

    This process reads the chunk whole (opening what the format keeps: files, clients,
    threads), then begins a second read and stops after its first batch. A child forked then
    (a real process, multiprocessing's ``fork``) reads the chunk with the same format and
    filesystem objects and closes the format. This process then finishes its second read and
    reads the chunk once more: neither may differ from the first read. Does nothing where
    ``fork`` is not available (Windows).

    Args:
        fmt: the format under test.
        chunk: a chunk of ``fmt``'s plan, best one with rows.
        fs: the filesystem the plan was made with.
        options: the plan's read options.
        schema: the plan's schema.
        timeout: seconds the child may take (it hangs on what it waits for of its parent's).

    Raises:
        AssertionError: the child read other rows, raised, died or hung, or this process
            reads differently afterwards.
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return
    want = _read(fmt, chunk, fs, options, schema)
    where = f"chunk {chunk.path} [{chunk.start}:{chunk.stop})"
    batches = iter(fmt.read(chunk, 0, chunk.num_rows, fs, options))
    try:
        first = next(batches, None)  # mid-read at the fork
        message = _read_in_child(fmt, chunk, fs=fs, options=options, want=want, timeout=timeout)
        if message is not None:
            raise AssertionError(f"{where}: in a child forked after a read, {message}")
        rest = [b for b in (first, *batches) if b is not None]
    finally:
        close = getattr(batches, "close", None)  # a generator left mid-read
        if close is not None:
            close()
    if not pa.Table.from_batches(rest, schema=schema).equals(want):
        raise AssertionError(f"{where}: a read begun before a fork reads other rows after it")
    again = _read(fmt, chunk, fs, options, schema)
    if not again.equals(want):
        raise AssertionError(f"{where}: reads other rows after a forked child closed the format")


def _read_in_child(
    fmt: Format,
    chunk: Chunk,
    *,
    fs: FileSystemSpec,
    options: ReadOptions,
    want: pa.Table,
    timeout: float,
) -> str | None:
    """What went wrong in a forked child reading ``chunk``, or ``None``."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_child,
        args=(send,),
        kwargs={"fmt": fmt, "chunk": chunk, "fs": fs, "options": options, "want": want},
        name="tdu-check-fork",
    )
    child.start()
    send.close()  # the child's end: the parent keeps only its own
    try:
        if not receive.poll(timeout):
            if child.is_alive():
                return (
                    f"reading did not finish in {timeout:g} s: it waits on something of its "
                    "parent's (a thread pool, a lock, a read started ahead)"
                )
            return f"the child died (exit code {child.exitcode}) before it answered"
        try:
            answer: str | None = receive.recv()
        except EOFError:
            child.join(timeout)
            return f"the child died (exit code {child.exitcode}) before it answered"
        return answer
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join(timeout)
