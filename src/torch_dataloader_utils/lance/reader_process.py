"""The Lance reader process: reads fragments' live rows for a forked worker, which must not call
pylance itself (`fork_reads`).

Run as a program (``python -c <this module's source> <folder>``): it imports the standard library,
pylance and pyarrow only, so it starts quickly, without torch or this package; ``<folder>`` is
where the worker's pylance was imported from, put first on the path (and the current directory
left off it), so that both read with the same pylance. It answers requests read
from stdin until stdin closes (its worker exited); each is a pickled `dict` (``uri``,
``storage_options``, ``version``, ``fragment``, ``columns``, ``offset``, ``limit``,
``batch_rows``), answered on stdout by pickled
frames: ``("batch", RecordBatch)`` per batch, then ``("end", None)``, or ``("error", (kind,
message))``.
"""

from __future__ import annotations

import pickle
import signal
import sys
from collections import OrderedDict
from typing import IO, Any

# Datasets kept open (as `format._DATASETS`).
_DATASETS = 4


def _answer(request: dict[str, Any], opened: OrderedDict[Any, Any], out: IO[bytes]) -> None:
    """Write the frames of one request's batches to ``out``."""
    import lance

    key = (request["uri"], request["version"])
    dataset = opened.get(key)
    if dataset is None:
        dataset = opened[key] = lance.dataset(
            request["uri"],
            version=request["version"],
            storage_options=request.get("storage_options"),
        )
        while len(opened) > _DATASETS:
            opened.popitem(last=False)
    opened.move_to_end(key)
    fragment = dataset.get_fragment(request["fragment"])
    if fragment is None:
        raise LookupError(f"no fragment {request['fragment']} at version {request['version']}")
    batches = fragment.to_batches(
        columns=request["columns"],
        offset=request["offset"],
        limit=request["limit"],
        batch_size=request["batch_rows"],
    )
    for batch in batches:
        pickle.dump(("batch", batch), out, protocol=5)


def serve(requests: IO[bytes], out: IO[bytes]) -> None:
    """Answer ``requests`` until they end, or until the worker stops reading the answers (it
    exited)."""
    opened: OrderedDict[Any, Any] = OrderedDict()
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            _answer(request, opened, out)
        except BrokenPipeError:
            return
        except Exception as exc:  # (sent to the worker, which raises it as the library's)
            frame: tuple[str, Any] = ("error", (type(exc).__name__, str(exc)))
        else:
            frame = ("end", None)
        try:
            pickle.dump(frame, out, protocol=5)
            out.flush()
        except BrokenPipeError:
            return


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the worker decides, and this process exits when
    # its stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = [*sys.argv[1:2], *(p for p in sys.path if p not in ("", "."))]
    answers = sys.stdout.buffer
    sys.stdout = sys.stderr  # (what a library prints must not break the frames)
    serve(sys.stdin.buffer, answers)
