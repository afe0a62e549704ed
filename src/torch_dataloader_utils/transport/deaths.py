"""DataLoader workers that die under a `TabularDataLoader` (the OOM killer, ``SIGKILL``).

torch reports a dead worker in several ways, depending on where the main process is when it
dies: its ``SIGCHLD`` handler raises ``RuntimeError("DataLoader worker (pid X) is killed by
signal: ...")`` at whatever line the main thread runs (user code included), a wait on the worker
queues raises ``RuntimeError("... exited unexpectedly")``, and a batch half received from the
dying worker raises ``ConnectionResetError`` or ``EOFError``. The iterator's worker pids also
stay in torch's registry (``torch.utils.data._utils.signal_handling``) until the iterator is
garbage collected, which a persistent iterator never is: the dead worker, or a later child
that reuses its pid, fires again in later, unrelated code.

So a loader's workers are in torch's registry only while the main process waits on them
(`watching`), which keeps torch's instant detection where it helps and nowhere else; an error
that comes out of such a wait is judged by the workers' exit status (`deaths`), not by its
message; and a broken iterator is shut down at once (`shut_down`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# The registry torch.utils.data._utils.signal_handling re-exports (typed only here).
from torch._C import _remove_worker_pids, _set_worker_pids

from ..errors import WorkerDiedError

__all__ = ["DEATH_GRACE_S", "Death", "deaths", "died_error", "release", "shut_down", "watching"]

# A worker whose sockets closed (ConnectionResetError in the main process) becomes waitable a
# moment later (milliseconds); an error of that kind is blamed on a death seen within this long.
DEATH_GRACE_S = 1.0


@dataclass(frozen=True)
class Death:
    """A worker process that ended with an error: its index, pid and exit code (``-N``:
    killed by signal ``N``)."""

    worker: int
    pid: int
    exitcode: int

    def describe(self) -> str:
        """``worker 1 (pid 4242) was killed by SIGKILL``."""
        if self.exitcode >= 0:
            return (
                f"worker {self.worker} (pid {self.pid}) exited with code {self.exitcode} (see "
                "its output above)"
            )
        try:
            name = signal.Signals(-self.exitcode).name
        except ValueError:
            name = f"signal {-self.exitcode}"
        return f"worker {self.worker} (pid {self.pid}) was killed by {name}"


def release(iterator: Any) -> None:
    """Take ``iterator``'s workers out of torch's ``SIGCHLD`` registry."""
    if getattr(iterator, "_worker_pids_set", False):
        _remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False


@contextmanager
def watching(iterator: Any) -> Iterator[None]:
    """While the main process waits on ``iterator``: its workers in torch's registry, so a
    worker's death interrupts the wait at once instead of after torch's 5 s status poll (or
    the loader's whole ``timeout``)."""
    if not iterator._worker_pids_set and not iterator._shutdown:
        pids = tuple(worker.pid for worker in iterator._workers)
        _set_worker_pids(id(iterator), pids)
        iterator._worker_pids_set = True
    try:
        yield
    finally:
        release(iterator)


def deaths(iterator: Any, *, wait: float = 0.0) -> list[Death]:
    """The workers of ``iterator`` that ended with an error, waiting up to ``wait`` seconds
    for one (none for an iterator torch shut down: it terminates its own workers)."""
    deadline = time.monotonic() + wait
    while True:
        if iterator._shutdown:
            return []
        found = []
        for index, worker in enumerate(iterator._workers):
            code = worker.exitcode  # reaps a dead worker; torch's registry must not hold it
            if code is not None and code != 0:
                found.append(Death(index, worker.pid, code))
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.01)


def died_error(lost: list[Death]) -> WorkerDiedError:
    """The error that reports ``lost``, saying how to resume."""
    who = "; ".join(death.describe() for death in lost)
    hint = ""
    if any(death.exitcode == -signal.SIGKILL for death in lost):
        hint = (
            " SIGKILL usually comes from the out-of-memory killer (see `dmesg`): fewer "
            "workers, a lower prefetch_factor or bundle_rows, or smaller batches use less."
        )
    return WorkerDiedError(
        f"DataLoader {who}: the batches it had not sent are lost and this pass stops. To "
        "finish the epoch, call loader.load_state_dict(state) with the state_dict() taken "
        "after the last batch you received (or loader.state_dict() taken now) and iterate "
        "again: new workers go on with the next batch, every row once." + hint
    )


def shut_down(iterator: Any) -> None:
    """Stop ``iterator``'s workers and take them out of torch's registry for good."""
    release(iterator)
    iterator._shutdown_workers()
