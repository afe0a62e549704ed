"""A descriptor passed to another process (a worker's memfd, torch's shared memory) goes through
multiprocessing's resource sharer, a UNIX socket in multiprocessing's temporary folder under
``TMPDIR``. A socket path is at most 107 bytes: under a long ``TMPDIR`` (a job scheduler's, a
test's) the bind fails in the queue's feeder thread, which prints the error and drops the
message, and the loader waits for it forever. `keep_socket_path_short` moves that folder to
``/tmp`` in such a process."""

from __future__ import annotations

import os
import shutil
import tempfile
from multiprocessing import process, util

__all__ = ["keep_socket_path_short"]

# The longest path of a UNIX socket (``sun_path`` less its final NUL).
_UNIX_PATH = 107
# What multiprocessing adds under TMPDIR: ``/pymp-XXXXXXXX/listener-XXXXXXXX``.
_ADDED = len("/pymp-xxxxxxxx/listener-xxxxxxxx")

_done_in: int | None = None  # the process it was done in (a fork's child checks again)


def keep_socket_path_short() -> None:
    """Give this process's multiprocessing a temporary folder under ``/tmp`` where the one it
    has, or would make, leaves no room for a socket's name; once per process."""
    global _done_in
    if _done_in == os.getpid():
        return
    _done_in = os.getpid()
    # (Where multiprocessing keeps it, util.get_temp_dir: a private attribute.)
    config: dict[str, object] = getattr(process.current_process(), "_config", {})
    folder = str(config.get("tempdir") or tempfile.gettempdir())
    if len(folder) + _ADDED <= _UNIX_PATH:
        return
    try:
        short = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    except OSError:  # no /tmp to write to: as multiprocessing would have it
        return
    util.Finalize(None, shutil.rmtree, args=[short], exitpriority=-100)  # (as util does)
    config["tempdir"] = short
