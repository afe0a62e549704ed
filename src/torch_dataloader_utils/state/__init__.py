"""Where an epoch stands: the loader state (small, versioned, read strictly) and the pass
control one rank's copies of a dataset share.

- `keys`: every key a state holds, and the strict reading of them;
- `codec`: a pass ↔ the state dict (`encode_state`, `decode_state`, a worker's stream state);
- `control`: the epoch and pass counters in shared memory (`PassControl`, ADR 0009);
- `passes`: one rank's passes (`Passes`): the contract between the loader and the dataset.

See docs/concepts/checkpointing.md.
"""

from .codec import (
    STATE_VERSION,
    STREAM_STATE_KIND,
    Iteration,
    Pass,
    decode_state,
    decode_stream_state,
    encode_state,
    encode_stream_state,
    is_complete,
    read_failures,
    with_read_failures,
)
from .control import WORKER_SLOTS, PassControl
from .passes import Passes, Progress, Readable

__all__ = [
    "STATE_VERSION",
    "STREAM_STATE_KIND",
    "WORKER_SLOTS",
    "Iteration",
    "Pass",
    "PassControl",
    "Passes",
    "Progress",
    "Readable",
    "decode_state",
    "decode_stream_state",
    "encode_state",
    "encode_stream_state",
    "is_complete",
    "read_failures",
    "with_read_failures",
]
