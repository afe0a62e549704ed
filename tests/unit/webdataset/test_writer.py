"""`ShardWriter`: shards webdataset 1.0.2 reads back identically, indexes equal to a scan, and
our index of webdataset's own shards."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.webdataset import (
    ShardWriter,
    build_index,
    format_index,
    index_path,
)
from torch_dataloader_utils.webdataset.index import ShardIndex

pytestmark = pytest.mark.timeout(60)


def samples(n: int) -> list[dict[str, Any]]:
    return [
        {
            "__key__": f"sample-{i:05d}",
            "txt": f"text {i} ü",
            "cls": i % 7,
            "bin": bytes([i % 256]) * (i * 37 % 1500),
        }
        for i in range(n)
    ]


def index_file(path: str) -> ShardIndex:
    data = Path(path).read_bytes()
    return build_index(lambda o, n: data[o : o + n], len(data), where=path)


def webdataset_samples(shards: list[str]) -> list[dict[str, Any]]:
    dataset = wds.WebDataset(shards, shardshuffle=False, empty_check=False)
    # webdataset adds __url__ and __local_path__: not sample content
    return [{k: v for k, v in s.items() if k == "__key__" or k[:2] != "__"} for s in dataset]


def encoded(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v if k == "__key__" else _bytes(v) for k, v in sample.items()}


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def test_webdataset_reads_our_shards_identically(tmp_path: Path) -> None:
    data = samples(250)
    with ShardWriter(str(tmp_path / "out" / "train-%04d.tar"), maxcount=100) as sink:
        for sample in data:
            sink.write(sample)
    assert [Path(p).name for p in sink.shards] == [
        "train-0000.tar",
        "train-0001.tar",
        "train-0002.tar",
    ]
    assert webdataset_samples(sink.shards) == [encoded(s) for s in data]
    for shard in sink.shards:
        idx = Path(index_path(shard))
        assert idx.read_text() == format_index(index_file(shard))  # the index equals a scan


def test_we_index_webdatasets_shards_identically(tmp_path: Path) -> None:
    data = samples(120)
    pattern = str(tmp_path / "theirs-%02d.tar")
    with wds.ShardWriter(pattern, maxcount=50, compress=False) as sink:
        for sample in data:
            sink.write(sample)
    shards = sorted(str(p) for p in tmp_path.glob("theirs-*.tar"))
    assert len(shards) == 3
    expected = webdataset_samples(shards)
    ours = []
    for shard in shards:
        raw = Path(shard).read_bytes()
        for sample in index_file(shard).samples:
            entry: dict[str, Any] = {"__key__": sample.key}
            entry.update({c.ext: raw[c.offset : c.end] for c in sample.components})
            ours.append(entry)
    assert ours == expected == [encoded(s) for s in data]


def test_maxsize_splits_and_is_respected(tmp_path: Path) -> None:
    data = samples(200)
    with ShardWriter(str(tmp_path / "s-%d.tar"), maxsize=40_000) as sink:
        for sample in data:
            sink.write(sample)
    assert len(sink.shards) > 3
    keys = []
    for shard in sink.shards:
        index = index_file(shard)
        assert padded_member_bytes(index) <= 40_000
        keys += [s.key for s in index.samples]
    assert keys == [s["__key__"] for s in data]  # every sample once, in order


def padded_member_bytes(index: ShardIndex) -> int:
    return sum(512 + -(-c.size // 512) * 512 for s in index.samples for c in s.components)


def test_a_sample_larger_than_maxsize_gets_its_own_shard(tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path / "s-%d.tar"), maxsize=2000) as sink:
        sink.write({"__key__": "a", "bin": b"1"})
        sink.write({"__key__": "b", "bin": b"x" * 5000})
        sink.write({"__key__": "c", "bin": b"1"})
    assert [[s.key for s in index_file(p).samples] for p in sink.shards] == [["a"], ["b"], ["c"]]


def test_shards_are_deterministic_and_never_empty(tmp_path: Path) -> None:
    for run in ("one", "two"):
        with ShardWriter(str(tmp_path / run / "s-%d.tar"), maxcount=10, start_shard=5) as sink:
            for sample in samples(20):
                sink.write(sample)
        assert [Path(p).name for p in sink.shards] == ["s-5.tar", "s-6.tar"]
    for name in ("s-5.tar", "s-6.tar", "s-5.idx"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    with ShardWriter(str(tmp_path / "none" / "s-%d.tar")) as sink:
        pass
    assert sink.shards == [] and not (tmp_path / "none").exists()


def test_values_are_encoded_by_type(tmp_path: Path) -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = torch.arange(5)
    image = Image.new("RGB", (4, 3), (10, 20, 30))
    sample = {
        "__key__": "k",
        "__url__": "not written",
        "json": {"a": [1, 2]},
        "npy": array,
        "pth": tensor,
        "png": image,
        "flag.cls": True,
        "score": 0.5,
        "id": np.int64(42),
    }
    with ShardWriter(str(tmp_path / "s-%d.tar"), index=False) as sink:
        sink.write(sample)
    assert not Path(index_path(sink.shards[0])).exists()
    [got] = webdataset_samples(sink.shards)
    assert set(got) == {"__key__", "json", "npy", "pth", "png", "flag.cls", "score", "id"}
    assert json.loads(got["json"]) == {"a": [1, 2]}
    assert np.array_equal(np.load(io.BytesIO(got["npy"])), array)
    assert torch.equal(torch.load(io.BytesIO(got["pth"])), tensor)
    assert Image.open(io.BytesIO(got["png"])).getpixel((0, 0)) == (10, 20, 30)
    assert (got["flag.cls"], got["score"], got["id"]) == (b"1", b"0.5", b"42")


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        ({"txt": "x"}, "__key__"),
        ({"__key__": "a.b", "txt": "x"}, "no dot"),
        ({"__key__": "dir/", "txt": "x"}, "non-empty"),
        ({"__key__": "a b", "txt": "x"}, "whitespace"),
        ({"__key__": "a", "txt": "x", "TXT": "y"}, "differ only in case"),
        ({"__key__": "a", "txt": object()}, "no encoding of a object"),
        ({"__key__": "a", "cls": {"a": 1}}, "no encoding of a dict for extension 'cls'"),
        ({"__key__": "a", "x/y": b""}, "invalid extension"),
        ({"__key__": "a"}, "no components"),
    ],
)
def test_bad_samples_are_refused(tmp_path: Path, sample: dict[str, Any], match: str) -> None:
    with (
        ShardWriter(str(tmp_path / "s-%d.tar")) as sink,
        pytest.raises(InvalidArgumentError, match=match),
    ):
        sink.write(sample)


def test_whitespace_keys_need_index_false(tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path / "s-%d.tar"), index=False) as sink:
        sink.write({"__key__": "a b", "txt": "x"})
    assert [s["__key__"] for s in webdataset_samples(sink.shards)] == ["a b"]


def test_bad_pattern_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="pattern"):
        ShardWriter(str(tmp_path / "no-field.tar"))
