"""``tdu explain``: one batch's rows (files and row numbers), from the plan and a saved state or
the options given.

With ``--state``, the batch is the saved loader's: its loader is planned again from the state's
layout and topology (packed sequences with ``--packing``, the state says so), the state is
loaded into it (its plan fingerprint checked), and the loader looks the batch up as it numbers
its batches (`TabularDataLoader.rows_at`). A state this command cannot plan for is refused,
saying what differs and what to pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
from typing import Any

from ..errors import InvalidArgumentError, StateMismatchError

__all__ = ["add_explain", "explain"]


def add_explain(explain: argparse.ArgumentParser) -> None:
    """The options of ``tdu explain``."""
    explain.add_argument("path", help="a path, URL, directory or glob")
    explain.add_argument(
        "--batch",
        type=int,
        required=True,
        help="the batch, numbered from the epoch's first on the rank (as loader.rows_at "
        "numbers it; required)",
    )
    explain.add_argument("--epoch", type=int, default=None, help="default: the state's, else 0")
    explain.add_argument("--rank", type=int, default=0, help="the rank")
    explain.add_argument(
        "--state",
        default=None,
        help="a saved loader state (JSON, or torch.save: alone or under a 'data' key); its "
        "options and topology replace the ones below (default: none)",
    )
    explain.add_argument("--format", default="parquet", help="the format's name")
    explain.add_argument(
        "--partitioning", default=None, help='"hive": key=value directory columns (default: none)'
    )
    explain.add_argument("--batch-size", type=int, default=1024, help="without --state")
    explain.add_argument("--shuffle", action="store_true", help="without --state")
    explain.add_argument("--seed", type=int, default=42, help="shuffle_seed, without --state")
    explain.add_argument("--world-size", type=int, default=1, help="without --state")
    explain.add_argument("--workers", type=int, default=0, help="without --state")
    packing = "as the saved loader's tdu.Packing"
    explain.add_argument(
        "--packing",
        default=None,
        metavar="COLUMN",
        help=f"packed sequences of this token column, {packing} (default: not packed)",
    )
    explain.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"{packing} (default: the state's tokens a sequence; without --state, required)",
    )
    explain.add_argument(
        "--packing-method", default="concat", choices=["concat", "best_fit"], help=packing
    )
    explain.add_argument("--eos-token", type=int, default=None, help=f"{packing} (default: none)")
    explain.add_argument("--fill", type=float, default=0.95, help=f"best fit's, {packing}")
    explain.add_argument("--columns", type=int, default=3, help="data columns to print")
    explain.add_argument("--limit", type=int, default=20, help="rows to print")


def explain(args: argparse.Namespace) -> int:
    """Print the rows of one batch, from a saved state or the options."""
    from .. import create_dataloader

    options: dict[str, Any] = {
        "batch_size": args.batch_size,
        "shuffle": args.shuffle,
        "shuffle_seed": args.seed,
        "world_size": args.world_size,
    }
    workers, epoch, state = args.workers, args.epoch, None
    if args.state is not None:  # the saved loader's own options and epoch, from its state
        state, saved, workers = _saved(args)
        options.update(saved)
        epoch = int(state["epoch"]) if epoch is None else epoch
    elif args.packing is not None:
        if args.seq_len is None:
            raise InvalidArgumentError("--packing needs --seq-len (or --state)")
        options["packing"] = _packing(args, args.seq_len)
    loader = create_dataloader(
        args.path,
        format=args.format,
        partitioning=args.partitioning,
        rank=args.rank,
        num_workers=workers,
        **options,
    )
    if state is not None:
        _load(loader, state, args)
    dataset = loader.dataset
    packed = options.get("packing") is not None
    data = [] if packed else dataset.plan.schema.names[: args.columns]
    table = loader.rows_at(args.batch, epoch=epoch or 0, rank=args.rank, columns=data)
    rows = f"{table.num_rows} rows"
    if packed:  # (a packed batch's rows are the fragments of documents it holds)
        tokens = sum(table.column("__fragment_tokens__").to_pylist())
        rows = f"{table.num_rows} fragments of documents, {tokens} tokens"
    plural = "" if workers == 1 else "s"
    print(
        f"epoch {epoch or 0}, rank {args.rank} of {options['world_size']}, {workers} "
        f"worker{plural}, batch {args.batch}: {rows}"
    )
    first = ["__file__", "__row__"]
    shown = [*first, *[c for c in table.column_names if c not in first]]
    for row in table.select(shown).to_pylist()[: args.limit]:
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    if table.num_rows > args.limit:
        print(f"  ... {table.num_rows - args.limit} more rows")
    return 0


def _saved(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The state saved at ``args.state``, the loader options it records and its workers.

    Raises:
        StateMismatchError: the file holds no loader state (it is named).
        InvalidArgumentError: a packed loader's state without ``--packing``, or the reverse.
    """
    from ..state.codec import decode_layout
    from ..state.keys import (
        LAYOUT,
        LOADER_KEYS,
        LOADER_OPTIONAL,
        NUM_WORKERS,
        TOPOLOGY,
        TOPOLOGY_KEYS,
        WORLD_SIZE,
        checked,
    )

    path = args.state
    state = _read_state(path)
    try:
        checked(state, LOADER_KEYS, "the state", LOADER_OPTIONAL)
        layout = decode_layout(state[LAYOUT], "its layout")
        topology = checked(state[TOPOLOGY], TOPOLOGY_KEYS, "its topology")
        world_size, workers = int(topology[WORLD_SIZE]), int(topology[NUM_WORKERS])
        epoch = int(state["epoch"])
    except StateMismatchError as exc:
        raise StateMismatchError(f"{path}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise StateMismatchError(
            f"{path}: malformed loader state ({exc}): expected what loader.state_dict() returns"
        ) from None
    options: dict[str, Any] = {
        "batch_size": layout.batch_size,
        "shuffle": layout.shuffle,
        "shuffle_seed": layout.seed,
        "drop_last": layout.drop_last,
        "remainder": layout.remainder,
        "split_strategy": layout.strategy,
        "world_size": world_size,
    }
    if layout.shuffle:
        options["shuffle_block_size"] = layout.block_rows
    seq_tokens = layout.seq_tokens
    if seq_tokens:  # packed sequences: the state's rows are tokens, a sequence of them
        if args.packing is None:
            raise InvalidArgumentError(
                f"{path} is the state of packed sequences (batches of "
                f"{layout.batch_size // seq_tokens} sequences of {seq_tokens} tokens of the "
                f"order, epoch {epoch}): pass --packing COLUMN (the token column), and the saved "
                "loader's --seq-len, --packing-method, --eos-token and --fill where they were "
                "not the defaults"
            )
        options["batch_size"] = layout.batch_size // seq_tokens
        if args.seq_len is None and args.packing_method != "concat":
            raise InvalidArgumentError(
                "--packing-method best_fit needs the saved loader's --seq-len: the state holds "
                f"{seq_tokens} tokens a sequence, seq_len times fill"
            )
        options["packing"] = _packing(args, args.seq_len or seq_tokens)
    elif args.packing is not None:
        raise InvalidArgumentError(
            f"{path} is not the state of packed sequences: leave --packing out"
        )
    return state, options, workers


def _read_state(path: str) -> dict[str, Any]:
    """The state saved at ``path``: JSON, or ``torch.save``'d (alone or under ``"data"``).

    Raises:
        StateMismatchError: the file holds neither (it is named).
    """
    with open(path, "rb") as f:
        head = f.read(64).lstrip()[:1]
    try:
        if path.endswith(".json") or head in (b"{", b"["):
            with open(path) as f:
                saved: Any = json.load(f)
        else:
            import torch

            saved = torch.load(path, weights_only=True)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StateMismatchError(f"{path} is not a saved loader state: not JSON ({exc})") from None
    except (pickle.UnpicklingError, EOFError, RuntimeError) as exc:
        # (RuntimeError: torch's own refusal of a file that is not its format; its message is
        # a page long.)
        raise StateMismatchError(
            f"{path} is not a saved loader state: neither JSON nor a torch.save file "
            f"(torch.load: {type(exc).__name__})"
        ) from None
    found = saved.get("data", saved) if isinstance(saved, dict) else saved
    if not isinstance(found, dict) or "layout" not in found:
        kind = ", ".join(sorted(map(str, found))[:6]) if isinstance(found, dict) else "no dict"
        raise StateMismatchError(
            f"{path} holds no loader state (found: {kind}): expected what loader.state_dict() "
            "returns, saved alone or under a 'data' key"
        )
    return found


def _load(loader: Any, state: dict[str, Any], args: argparse.Namespace) -> None:
    """Load ``state`` into ``loader``, refusing it where the loader does not plan as the saved
    loader did: other data (the plan's fingerprint), or another layout.

    Raises:
        StateMismatchError: what differs, and what explain plans.
    """
    from ..planning import Layout
    from ..state.codec import decode_layout

    packed = ""
    packing = loader.dataset.options.packing
    if packing is not None:
        packed = (
            f", packed as Packing({packing.column!r}, seq_len={packing.seq_len}, method="
            f"{packing.method!r}, eos_token={packing.eos_token}, fill={packing.fill})"
        )
    hive = ", hive partitions" if args.partitioning else ""
    plans = (
        f"explain plans {args.path} as one source of format {args.format}, every column, no "
        f"filter{hive}{packed}"
    )
    python = (
        "explain a batch of a mixture, columns=, filters= or a token budget in Python: its "
        "loader built as it was then, loader.load_state_dict(state), loader.rows_at(batch)"
    )
    try:
        loader.load_state_dict(state)
    except StateMismatchError as exc:
        from ..state.codec import RESUME_ANYWAY  # (a load_state_dict keyword: not for here)

        refusal = str(exc).replace(RESUME_ANYWAY, "")
        raise StateMismatchError(
            f"{args.state} does not fit {args.path}: {refusal}. {plans}; {python}"
        ) from None
    saved, now = decode_layout(state["layout"], "layout"), loader.dataset.layout
    changed = [
        f"{f.name} {getattr(saved, f.name)} then, {getattr(now, f.name)} now"
        for f in dataclasses.fields(Layout)
        if getattr(saved, f.name) != getattr(now, f.name)
    ]
    if changed:
        raise StateMismatchError(
            f"{args.state} was saved by a loader that ordered the rows otherwise than {args.path} "
            f"plans now ({'; '.join(changed)}): {plans}; {python}"
        )


def _packing(args: argparse.Namespace, seq_len: int) -> Any:
    from ..batching import Packing

    return Packing(
        args.packing,
        seq_len=seq_len,
        method=args.packing_method,
        eos_token=args.eos_token,
        fill=args.fill,
    )
