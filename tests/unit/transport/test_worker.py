"""`transport.worker`: what the loader does in its process before workers fork."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Run in a process of its own: its memory is this test's alone.
_SCRIPT = textwrap.dedent(
    """
    import gc
    import numpy as np, psutil, pyarrow as pa, pyarrow.compute as pc
    from torch_dataloader_utils.transport import starting_workers

    def rss():
        return psutil.Process().memory_info().rss

    base = pa.array(np.arange(250_000, dtype=np.int32))
    kept = [pc.add(base, i) for i in range(64)]  # ~128 MB in pyarrow's pool, 2 MB a piece
    assert pa.default_memory_pool().bytes_allocated() >= 64 * 250_000 * 4
    del kept
    gc.collect()
    freed = rss()
    starting_workers()
    released = rss()
    assert pc.sum(pc.add(base, 1)).as_py() == sum(range(1, 250_001))  # the pool still works
    print((freed - released) >> 20)
    """
)


def test_starting_workers_gives_back_the_memory_the_pool_keeps_freed() -> None:
    """A forked worker would copy each kept page it writes (copy on write); given back, its
    pages are new ones."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) >= 64  # MB of the ~128 freed, no longer resident
