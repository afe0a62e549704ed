"""`stream.pack_kernel`: the compiled pass gives concat packing's arrays exactly as numpy's
passes do (the fallback), and so does its Python source run as it is; it loads where numba is
installed (the test environment has the ``fast`` extra) and stays off with ``TDU_COMPILED=0``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.stream import pack_kernel
from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.packing import Packed, PackedConverter, pack
from torch_dataloader_utils.transport import wire

FIELDS = ("input_ids", "position_ids", "document_ids", "cu_seqlens", "source_ids")


def _same(a: Packed, b: Packed) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y), name
    assert (a.max_seqlen, a.padding) == (b.max_seqlen, b.padding)


# Fragments: (document, position, length) each, a run of one document going on now and then
# (what `Fragments.concat` would join, and a cut between blocks leaves), from 0-2 sources.
fragment_lists = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 9), st.booleans()),
    min_size=1,
    max_size=12,
)


def _fragments(
    spec: list[tuple[int, int, int, bool]], sources: bool, dtype: str, cuts: list[int] = ()
) -> Fragments:
    """Fragments of ``spec`` over one buffer, or over it cut at ``cuts`` into several (a
    fragment may run from one into the next)."""
    begin, end, document, position, source = [], [], [], [], []
    at = 0
    for drawn, drawn_position, length, goes_on in spec:
        doc, pos = drawn, drawn_position
        if goes_on and document:  # the document before it, its positions continued
            doc, pos = document[-1], position[-1] + (end[-1] - begin[-1])
        begin.append(at + 3)  # (gaps: fragments are ranges of a larger buffer)
        end.append(at + 3 + length)
        document.append(doc)
        position.append(pos)
        source.append(doc % 2)
        at = end[-1]
    values = np.arange(at + 5, dtype=dtype) * 7 % 50_000
    return Fragments.of(
        tuple(np.split(values, sorted(min(c, len(values)) for c in cuts))),
        np.array(begin, np.int64),
        np.array(end, np.int64),
        np.array(document, np.int64),
        np.array(position, np.int64),
        np.array(source, np.int16) if sources else None,
    )


@settings(max_examples=300, deadline=None)
@given(
    spec=fragment_lists,
    seq_len=st.integers(1, 10),
    skip=st.integers(0, 6),
    sources=st.booleans(),
    dtype=st.sampled_from(["int32", "int64", "uint16", "uint32"]),
    positions=st.sampled_from(["fragment", "document"]),
    extra_rows=st.sampled_from([None, 0, 2]),
    cuts=st.lists(st.integers(0, 60), max_size=10),
)
def test_the_compiled_pass_and_its_python_source_pack_as_numpy_does(
    spec: list[tuple[int, int, int, bool]],
    seq_len: int,
    skip: int,
    sources: bool,
    dtype: str,
    positions: str,
    extra_rows: int | None,
    cuts: list[int],
) -> None:
    """The tokens in one buffer or in several (a block's decoded parts, more than the kernel
    takes copied into one), the same arrays by every path."""
    assert pack_kernel.load(), "numba is installed with the test extra: the kernel loads"
    fragments = _fragments(spec, sources, dtype, cuts).slice(skip)
    assert np.array_equal(fragments.tokens(), _fragments(spec, sources, dtype).slice(skip).tokens())
    rows = None if extra_rows is None else -(-fragments.num_rows // seq_len) + extra_rows
    compiled = pack(fragments, seq_len, pad_value=-5, positions=positions, rows=rows)
    kernel = pack_kernel._state.kernel
    try:
        pack_kernel._state.kernel = None
        by_numpy = pack(fragments, seq_len, pad_value=-5, positions=positions, rows=rows)
        pack_kernel._state.kernel = dict.fromkeys(
            map(np.dtype, ["int32", "int64"]), pack_kernel.concat_kernel
        )
        by_python = pack(fragments, seq_len, pad_value=-5, positions=positions, rows=rows)
    finally:
        pack_kernel._state.kernel = kernel
    _same(compiled, by_numpy)
    _same(by_python, by_numpy)


def test_a_real_batch_of_long_documents_packs_the_same() -> None:
    """Documents of 32-992 tokens (the benchmark's), a batch of 8 x 2,048 cut from a
    shuffled run of them: numpy's arrays, then the compiled pass's."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(32, 993, 200)
    end = np.cumsum(lengths)
    values = rng.integers(0, 50_000, int(end[-1])).astype(np.int32)
    order = rng.permutation(200)
    fragments = Fragments.of(
        values,
        (end - lengths)[order],
        end[order],
        order.astype(np.int64),
        np.zeros(200, np.int64),
    )
    batches = [fragments.slice(at, 16_384) for at in range(0, fragments.num_rows, 16_384)]
    kernel = pack_kernel._state.kernel
    pack_kernel._state.kernel = None
    try:
        by_numpy = [pack(b, 2048, pad_value=0) for b in batches]
        pack_kernel._state.tried = False  # (loaded again here, as a fresh process would)
        assert pack_kernel.load()
        for batch, want in zip(batches, by_numpy, strict=True):
            _same(pack(batch, 2048, pad_value=0), want)
    finally:
        pack_kernel._state.kernel = kernel
        pack_kernel._state.tried = True


@pytest.mark.parametrize("setting", ["0", "1"])
def test_tdu_compiled_0_packs_with_numpy(setting: str) -> None:
    """In a fresh process: ``TDU_COMPILED=0`` leaves numba unimported and numpy packing;
    otherwise the kernel loads. The packed arrays are the same."""
    code = (
        "import sys, numpy as np, pyarrow as pa\n"
        "from torch_dataloader_utils.stream import pack_kernel\n"
        "from torch_dataloader_utils.stream.fragments import Fragments\n"
        "from torch_dataloader_utils.stream.packing import pack\n"
        "f = Fragments.from_lists(pa.array([[1, 2, 3], [4, 5]]), 0)\n"
        "p = pack(f, 4, pad_value=-1)\n"
        "print(pack_kernel._state.kernel is not None, 'numba' in sys.modules)\n"
        "print(p.input_ids.tolist(), p.position_ids.tolist(), p.cu_seqlens.tolist())\n"
    )
    env = {**os.environ, pack_kernel.COMPILED_ENV: setting}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    loaded, arrays = out.stdout.splitlines()
    assert loaded == ("True True" if setting == "1" else "False False")
    assert arrays == "[[1, 2, 3, 4], [5, -1, -1, -1]] [[0, 1, 2, 0], [0, 0, 1, 2]] [0, 3, 4, 5, 8]"


@pytest.mark.parametrize(
    ("compiled", "method", "static"),
    [
        (True, "concat", False),
        (False, "concat", False),
        (True, "best_fit", False),
        (True, "concat", True),
        (False, "concat", True),
    ],
)
def test_a_workers_batch_written_into_its_buffer_is_the_batch_packed_in_process(
    compiled: bool, method: str, static: bool
) -> None:
    """A worker's batches (`PackedConverter.planned`, two in a bundle sent by
    `wire.pack_planned`): the compiled pass writes a batch's arrays and boundaries into the
    transport buffer in one call (settling how many boundaries and ``max_seqlen``), numpy's
    writers each in turn; either way the batches that arrive are the ones numpy's packing
    makes in one process, keys in its order."""
    assert pack_kernel.load()
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 40, 30)
    end = np.cumsum(lengths)
    values = rng.integers(0, 1000, int(end[-1])).astype(np.int64)
    three = (np.arange(30) % 3).astype(np.int16)
    # (A mixture's tokens carry their sources, sent only when a source column is asked for.)
    for source, column in ((None, None), (three, "source"), (three, None)):
        whole = Fragments.of(
            values, end - lengths, end, np.arange(30), np.zeros(30, np.int64), source
        )
        batches = [whole.slice(5, 300), whole.slice(305, 130)]
        convert = PackedConverter(
            64,
            -1,
            source_key=column,
            method=method,
            static_shape=static,
            batch_size=6,
            batch_tokens=300,
        )
        kernel = pack_kernel._state.kernel
        pack_kernel._state.kernel = kernel if compiled else None
        try:
            arrived = wire.pack_planned([convert.planned(b) for b in batches]).unpack()
            pack_kernel._state.kernel = None
            wanted = [convert(b) for b in batches]
        finally:
            pack_kernel._state.kernel = kernel
        for got, want in zip(arrived, wanted, strict=True):
            assert list(got) == list(want)
            for key, value in want.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(got[key], value), key
                else:
                    assert got[key] == value, key
