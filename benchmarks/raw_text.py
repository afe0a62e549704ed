"""Tokenizing in the loader (issue 43) against the tokenizer's own speed, measured in the same run.

The corpus: ``--mb`` MB of generated raw text (Zipf-distributed pseudo-words, 4% of them
multi-byte, documents of log-normal length around 2.5 KB like an LLM's web text) in 8 Parquet
files of 1 MB row groups (a chunk each), and the same documents pre-tokenized (an ``id`` and a
``tokens`` column, written once). The tokenizer: a byte-level BPE of ``--vocab`` ids trained
in-process on a sample, every document ending with its end-of-text id.

The limit: the tokenizer alone, ``encode_batch_fast`` over batches of ``--batch`` (1,024)
texts already in a Python list, one thread (``TOKENIZERS_PARALLELISM=false``): its tokens/s on
one core, times the cores a configuration has. (A chunk's read is tokenized in batches of its
Parquet reads, here ~300 texts: on documents of ~2.5 KB ``--batch 300`` made the tokenizer
~12% faster than 1,024 per text, a stricter limit.) Measured against it:

- the census: ``create_dataloader(tokenize=..., packing=...)`` with a fresh ``cache_dir`` and
  ``census_dir`` (planning, every chunk tokenized once in threads over the cores), against the
  one-core time over ``os.cpu_count()`` cores (goal: at most 1.15);
- planning again with the census kept: a fresh ``cache_dir`` and the same ``census_dir`` (the
  counts read back, the plan made again), then the same ``cache_dir`` (the kept plan), each
  against planning the pre-tokenized corpus the same way (goal: about 1.0);
- the training read: real tokens/s of whole epochs of ``tokenize`` + ``packing``, shuffled,
  ``num_workers`` 0 (one core) and 2 (``min(2, cores)`` cores) against the tokenizer on those
  cores (goal: at least 0.9), and the pre-tokenized corpus's packed read beside it. Each
  loader's best of ``--epochs`` epochs (after a first one that starts its workers). As the
  cores of a shared or virtual machine seldom give twice one core's rate, the tokenizer is also
  timed in ``min(2, cores)`` processes at once, a share of the texts each (``measured``).

Every number is the best of ``--repeat`` rounds (a shared machine's noise is all upward).
``--profile`` also runs one in-process epoch under cProfile and prints where its time goes.

Usage::

    python benchmarks/raw_text.py                 # 24 MB of text, vocabulary 8,000
    python benchmarks/raw_text.py --mb 8 --repeat 1
    python benchmarks/raw_text.py --profile
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per encode_batch

import argparse
import cProfile
import io
import multiprocessing
import pstats
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import torch_dataloader_utils as tdu

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
FILES, ROW_GROUP_BYTES, EOS = 8, 2**20, "<|endoftext|>"
# (split when the corpus is made: 40 syllables and 19 multi-byte pieces words are made of)
SYLLABLES = (
    "ka ro mi ten sa lo ver in an de ul tor es pa ri con ma tion el ho nu st ge ly ble ex pre "
    "qu ar ing ed er ou ch th wa zi fo ba ne"
)
FOREIGN = "ά λο γε ми жу да те 東 京 数 据 こん に ち é ü ñ ø 🙂"
MARKS = [".", ".", ".", ",", ",", ";", ":", "!", "?", ".\n\n"]


def make(mb: int) -> Path:
    """``mb`` MB of documents: a text corpus (``id``, ``text``) under ``text/``."""
    root = DATA / f"raw-text-{mb}mb"
    if (root / "text" / "_done").exists():
        return root
    (root / "text").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    latin, foreign = SYLLABLES.split(), FOREIGN.split()
    words = [
        "".join(rng.choice(foreign if rng.random() < 0.04 else latin, rng.integers(1, 5)))
        for _ in range(30_000)
    ]
    zipf = 1.0 / (np.arange(len(words)) + 2.7) ** 1.07
    texts, size = [], 0
    while size < mb * 2**20:
        count = max(1, int(np.clip(rng.lognormal(np.log(2500), 0.9), 100, 40_000)) // 7)
        picked = [words[i] for i in rng.choice(len(words), count, p=zipf / zipf.sum())]
        for at in np.flatnonzero(rng.random(count) < 0.07):
            picked[at] += MARKS[int(rng.integers(len(MARKS)))]
        texts.append(" ".join(picked))
        size += len(texts[-1].encode())
    per_file = np.array_split(np.arange(len(texts)), FILES)
    rows_per_group = max(1, len(texts) * ROW_GROUP_BYTES // size)
    for part, rows in enumerate(per_file):
        table = pa.table({"id": rows, "text": [texts[i] for i in rows]})
        pq.write_table(table, root / "text" / f"part-{part}.parquet", row_group_size=rows_per_group)
    (root / "text" / "_done").touch()
    return root


def texts_of(folder: Path) -> list[str]:
    return pq.read_table(folder, columns=["text"]).column("text").to_pylist()


def tokenizer(root: Path, texts: list[str], vocab: int) -> Tokenizer:
    """A byte-level BPE trained on ~800 documents spread over the corpus (kept: training is
    deterministic anyway)."""
    path = root / f"bpe-{vocab}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts[:: max(1, len(texts) // 800)], trainer)  # (~800 documents)
    tok.save(str(path))
    return tok


def pretokenized(root: Path, tok: Tokenizer, vocab: int) -> Path:
    """The text corpus's documents tokenized once (the oracle), in the same files and row
    groups: ``id``, ``tokens``."""
    out = root / f"tokens-{vocab}"
    if (out / "_done").exists():
        return out
    out.mkdir(exist_ok=True)
    eos = tok.token_to_id(EOS)
    for path in sorted((root / "text").glob("*.parquet")):
        file = pq.ParquetFile(path)
        table = file.read()
        texts = table.column("text").to_pylist()
        ids = [[*e.ids, eos] for e in tok.encode_batch_fast(texts, add_special_tokens=False)]
        tokens = pa.table({"id": table.column("id"), "tokens": pa.array(ids, pa.list_(pa.int32()))})
        rows = file.metadata.row_group(0).num_rows
        pq.write_table(tokens, out / path.name, row_group_size=rows)
    (out / "_done").touch()
    return out


def one_core(tok: Tokenizer, texts: list[str], batch: int) -> tuple[float, float, int]:
    """Seconds of ``encode_batch_fast`` over the corpus on one thread, ``batch`` texts a call;
    the seconds taking each text's ids out as a list add; the tokens (end-of-text ids too)."""
    encoding = taking = 0.0
    tokens = 0
    for at in range(0, len(texts), batch):
        start = time.perf_counter()
        done = tok.encode_batch_fast(texts[at : at + batch], add_special_tokens=False)
        middle = time.perf_counter()
        ids = [e.ids for e in done]
        encoding, taking = encoding + middle - start, taking + time.perf_counter() - middle
        tokens += sum(map(len, ids)) + len(ids)
    return encoding, taking, tokens


# (the tokenizer and texts the processes of `processes` share, by fork)
_SHARED: tuple[Tokenizer, list[str], int, int] | None = None


def _share(part: int) -> float:
    assert _SHARED is not None
    tok, texts, parts, batch = _SHARED
    mine = texts[part::parts]
    start = time.perf_counter()
    for at in range(0, len(mine), batch):
        tok.encode_batch_fast(mine[at : at + batch], add_special_tokens=False)
    return time.perf_counter() - start


def processes(tok: Tokenizer, texts: list[str], count: int, batch: int) -> float:
    """Seconds ``count`` processes take to tokenize a share of the texts each, at once (the
    slowest one's): what the machine's cores give the tokenizer, beside one core's x cores."""
    global _SHARED
    _SHARED = (tok, texts, count, batch)
    try:
        with multiprocessing.get_context("fork").Pool(count) as pool:
            return max(pool.map(_share, range(count)))
    finally:
        _SHARED = None


def loader(
    folder: Path, tok: Tokenizer | None, workers: int, cache: Path, census: Path | None = None
) -> tdu.TabularDataLoader:
    """The packed loader of ``folder``: the text tokenized by ``tok``, else the tokens read."""
    tokenize = None
    if tok is not None:
        tokenize = tdu.Tokenize("text", tok, eos_token=tok.token_to_id(EOS))
    return tdu.create_dataloader(
        str(folder),
        format="parquet",
        columns=["text"] if tok is not None else ["tokens"],
        tokenize=tokenize,
        packing=tdu.Packing(column="tokens", seq_len=2048, pad_value=0),
        batch_size=8,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        cache_dir=str(cache),
        census_dir=None if census is None else str(census),
    )


def planned(*args: object, **kwargs: object) -> float:
    """Seconds to build the loader (its planning, the census included) and size it."""
    start = time.perf_counter()
    len(loader(*args, **kwargs))  # type: ignore[arg-type]
    return time.perf_counter() - start


def epochs(made: tdu.TabularDataLoader, count: int) -> tuple[float, int]:
    """Real tokens/s of the best of ``count`` epochs (after a first one that starts the
    workers, when there are any), and the tokens of an epoch."""
    best, tokens = 0.0, 0
    first = 0 if made.num_workers else 1
    for epoch in range(first, 1 + count):
        made.set_epoch(epoch)
        start = time.perf_counter()
        tokens = sum(int((b["document_ids"] >= 0).sum()) for b in made)
        if epoch:
            best = max(best, tokens / (time.perf_counter() - start))
    return best, tokens


def profile(text: Path, tok: Tokenizer, cache: Path) -> None:
    """One in-process epoch under cProfile, its reading thread's time included: the functions
    that take its time."""
    made = loader(text, tok, 0, cache)
    profiles, threads, run = [cProfile.Profile()], [], threading.Thread.run

    def profiled(thread: threading.Thread) -> None:  # (the prefetch thread reads and tokenizes)
        threads.append(thread)
        profiles.append(cProfile.Profile())
        profiles[-1].runcall(run, thread)

    threading.Thread.run = profiled  # type: ignore[method-assign]
    try:
        profiles[0].runcall(lambda: sum(1 for _ in made))
        for thread in threads:
            thread.join()
    finally:
        threading.Thread.run = run  # type: ignore[method-assign]
    out = io.StringIO()
    stats = pstats.Stats(*profiles, stream=out)
    stats.sort_stats("tottime").print_stats(12)
    print("\none in-process epoch, main and reading threads, by own time:")
    print(out.getvalue().split("\n\n", 2)[-1].rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=24, help="MB of text")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs a loader")
    parser.add_argument("--batch", type=int, default=1024, help="texts a call in the limit")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    cores, load = os.cpu_count() or 1, os.getloadavg()[0]
    root = make(args.mb)
    texts = texts_of(root / "text")
    tok = tokenizer(root, texts, args.vocab)
    tokens_root = pretokenized(root, tok, args.vocab)
    best: dict[str, float] = {}

    def keep(name: str, value: float, high: bool = False) -> None:
        best[name] = (
            max(best.get(name, value), value) if high else min(best.get(name, value), value)
        )

    scratch = Path(tempfile.mkdtemp(prefix="tdu-bench-tokenize-"))
    try:
        for round_ in range(args.repeat):
            alone, taking, tokens = one_core(tok, texts, args.batch)
            keep("one core", alone)
            keep("ids", taking)
            for count in {min(2, cores), cores}:
                keep(f"processes {count}", processes(tok, texts, count, args.batch))
            here = scratch / str(round_)
            census, a, b, c, d = (here / n for n in ("census", "a", "b", "c", "d"))
            keep("census", planned(root / "text", tok, 0, a, census))
            keep("census kept", planned(root / "text", tok, 0, b, census))
            keep("plan kept", planned(root / "text", tok, 0, b, census))
            keep("pre plan", planned(tokens_root, None, 0, c))
            keep("pre plan kept", planned(tokens_root, None, 0, c))
            for workers in (0, 2):
                rate, read = epochs(loader(root / "text", tok, workers, b, census), args.epochs)
                assert read == tokens, (read, tokens)  # every token, once
                keep(f"read w{workers}", rate, high=True)
                pre, _ = epochs(loader(tokens_root, None, workers, d), args.epochs)
                keep(f"pre read w{workers}", pre, high=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    rate = tokens / best["one core"]
    print(
        f"{len(texts):,} documents, {sum(map(len, texts)) / 2**20:.0f} M characters, "
        f"{tokens:,} tokens (vocabulary {tok.get_vocab_size():,}); {cores} cores; "
        f"best of {args.repeat}; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after"
        + (" (other work on the machine: slower numbers)" if load > 0.5 else "")
    )
    twos = best[f"processes {min(2, cores)}"]
    print(
        f"tokenizer, one core: {best['one core']:.2f} s, {rate:,.0f} tokens/s (taking each "
        f"text's ids out as a list: {best['ids']:.2f} s more); {min(2, cores)} processes at "
        f"once: {twos:.2f} s"
        + ("" if cores <= 2 else f", {cores}: {best[f'processes {cores}']:.2f} s")
    )
    print(
        f"\n{'planning (seconds)':<40}{'ours':>8}{'limit':>8}{'ratio':>7}{'measured':>10}"
        f"{'ratio':>7}  goal"
    )
    cores_limit = (best["one core"] / cores, best[f"processes {cores}"])
    rows = [
        ("census (fresh cache_dir and census_dir)", "census", cores_limit, "<= 1.15"),
        ("census kept, fresh cache_dir", "census kept", (best["pre plan"], None), "~ 1.0"),
        ("census and plan kept (same cache_dir)", "plan kept", (best["pre plan kept"], None), ""),
        ("pre-tokenized, fresh cache_dir", "pre plan", None, ""),
        ("pre-tokenized, same cache_dir", "pre plan kept", None, ""),
    ]
    for label, name, limits, goal in rows:
        ours = best[name]
        tail = ""
        if limits is not None:
            limit, measured = limits
            tail = f"{limit:>8.3f}{ours / limit:>7.2f}"
            tail += " " * 17 if measured is None else f"{measured:>10.3f}{ours / measured:>7.2f}"
            tail += f"  {goal or '~ 1.0'}"
        print(f"{label:<40}{ours:>8.3f}{tail}")
    print(
        f"\n{'training read (tokens/s)':<32}{'ours':>11}{'limit':>11}{'ratio':>7}"
        f"{'measured':>11}{'ratio':>7}{'pre-tok':>12}"
    )
    for workers in (0, 2):
        limit = rate * (1 if workers == 0 else min(2, cores))
        measured = rate if workers == 0 else tokens / twos
        ours = best[f"read w{workers}"]
        print(
            f"{f'tokenize + packing, {workers} workers':<32}{ours:>11,.0f}{limit:>11,.0f}"
            f"{ours / limit:>7.2f}{measured:>11,.0f}{ours / measured:>7.2f}"
            f"{best[f'pre read w{workers}']:>12,.0f}  goal >= 0.9"
        )

    if args.profile:
        with tempfile.TemporaryDirectory(prefix="tdu-bench-tokenize-") as folder:
            profile(root / "text", tok, Path(folder))


if __name__ == "__main__":
    main()
