"""Throughput in a container's 64 MiB ``/dev/shm`` against the machine's own, in the same run.

Each configuration is one `throughput.py` run (a subprocess, two epochs, the warm one counted),
started either as it is or inside a private mount namespace whose ``/dev/shm`` is a 64 MiB
tmpfs, as Docker and Kubernetes give by default (needs root: ``unshare -m``). Ours runs with the
default buffers (a memfd: not bounded by ``/dev/shm``) and with ``TDU_SHARED_MEMORY=dev-shm``
(bundles sized from the room ``/dev/shm`` has, too large ones through the pipe). The limit is
raw pyarrow, as in `throughput.py`.

Usage::

    sudo python benchmarks/small_shm.py                  # tabular + token lists, 2 and 4 workers
    sudo python benchmarks/small_shm.py --batch-size 8192
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from throughput import DATA, make_tabular, make_tokens, one_command  # noqa: E402

SHM_MIB = 64


def measure(
    kind: str, data: Path, batch_size: int, *, small_shm: bool, memory: str
) -> dict[str, Any]:
    """One `throughput.py --one` run, in a 64 MiB ``/dev/shm`` when ``small_shm``."""
    command = one_command(kind, data, batch_size, "padded")
    env = dict(os.environ)
    if memory == "dev-shm":
        env["TDU_SHARED_MEMORY"] = "dev-shm"
    if small_shm:
        inner = f"mount -t tmpfs -o size={SHM_MIB}m tmpfs /dev/shm && exec {shlex.join(command)}"
        command = ["unshare", "-m", "--propagation", "private", "sh", "-c", inner]
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--token-rows", type=int, default=125_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--repeat", type=int, default=2, help="runs per config; best is kept")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("small_shm.py: needs root, for a private mount namespace (unshare -m)")
    datasets = [
        ("tabular", make_tabular(DATA, args.rows)),
        ("tokens (padded)", make_tokens(DATA, args.token_rows)),
    ]
    configs = [
        ("default, memfd", False, "memfd"),
        ("default, dev-shm", False, "dev-shm"),  # the buffers before memfd
        ("64 MiB, memfd", True, "memfd"),
        ("64 MiB, dev-shm", True, "dev-shm"),
    ]
    print(f"cpus={os.cpu_count()} batch_size={args.batch_size} best of {args.repeat}")
    print("x limit: rows/s over raw pyarrow iter_batches (one process, no shuffle), same run")
    print(
        f"{'dataset':16} {'workers':>7} {'/dev/shm, buffers':18} {'rows/s':>11} {'x limit':>8} "
        f"{'total µs/row':>13}"
    )
    for label, data in datasets:
        limit = max(  # the faster of pyarrow with and without its threads, as throughput.py
            measure(raw, data, args.batch_size, small_shm=False, memory="memfd")["rows_per_s"]
            for raw in ("raw", "raw-threads")
            for _ in range(args.repeat)
        )
        print(f"{label:16} {'raw':>7} {'default':18} {limit:11,.0f} {1:8.2f}", flush=True)
        for workers in (int(w) for w in args.workers.split(",")):
            for name, small, memory in configs:
                runs = [
                    measure(
                        f"ours-w{workers}", data, args.batch_size, small_shm=small, memory=memory
                    )
                    for _ in range(args.repeat)
                ]
                failed = [r for r in runs if "error" in r]
                if failed:
                    print(f"{label:16} {workers:7} {name:18} FAILED: {failed[0]['error']}")
                    continue
                best = max(runs, key=lambda r: r["rows_per_s"])
                print(
                    f"{label:16} {workers:7} {name:18} {best['rows_per_s']:11,.0f} "
                    f"{best['rows_per_s'] / limit:8.2f} {best['total_us_per_row']:13.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
